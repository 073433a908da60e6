from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EOK: _ClassVar[StatusCode]
    ENOLEDGER: _ClassVar[StatusCode]
    ENOENTRY: _ClassVar[StatusCode]
    EBADREQ: _ClassVar[StatusCode]
    EIO: _ClassVar[StatusCode]
    EUA: _ClassVar[StatusCode]
    EBADVERSION: _ClassVar[StatusCode]
    EFENCED: _ClassVar[StatusCode]
    EREADONLY: _ClassVar[StatusCode]
    ETOOMANYREQUESTS: _ClassVar[StatusCode]
    EUNKNOWNLEDGERSTATE: _ClassVar[StatusCode]

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERSION_UNSPECIFIED: _ClassVar[ProtocolVersion]
    VERSION_ONE: _ClassVar[ProtocolVersion]

class AddFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADD_NONE: _ClassVar[AddFlag]
    RECOVERY_ADD: _ClassVar[AddFlag]

class ReadFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_NONE: _ClassVar[ReadFlag]
    FENCE_LEDGER: _ClassVar[ReadFlag]
    ENTRY_PIGGYBACK: _ClassVar[ReadFlag]
EOK: StatusCode
ENOLEDGER: StatusCode
ENOENTRY: StatusCode
EBADREQ: StatusCode
EIO: StatusCode
EUA: StatusCode
EBADVERSION: StatusCode
EFENCED: StatusCode
EREADONLY: StatusCode
ETOOMANYREQUESTS: StatusCode
EUNKNOWNLEDGERSTATE: StatusCode
VERSION_UNSPECIFIED: ProtocolVersion
VERSION_ONE: ProtocolVersion
ADD_NONE: AddFlag
RECOVERY_ADD: AddFlag
READ_NONE: ReadFlag
FENCE_LEDGER: ReadFlag
ENTRY_PIGGYBACK: ReadFlag

class AddRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "flag", "master_key", "body", "request_id")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    flag: AddFlag
    master_key: bytes
    body: bytes
    request_id: int
    def __init__(self, ledger_id: int | None = ..., entry_id: int | None = ..., flag: AddFlag | str | None = ..., master_key: bytes | None = ..., body: bytes | None = ..., request_id: int | None = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "entry_id", "request_id", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    entry_id: int
    request_id: int
    detail: str
    def __init__(self, status: StatusCode | str | None = ..., ledger_id: int | None = ..., entry_id: int | None = ..., request_id: int | None = ..., detail: str | None = ...) -> None: ...

class AddBatch(_message.Message):
    __slots__ = ("adds",)
    ADDS_FIELD_NUMBER: _ClassVar[int]
    adds: _containers.RepeatedCompositeFieldContainer[AddRequest]
    def __init__(self, adds: _Iterable[AddRequest | _Mapping] | None = ...) -> None: ...

class AddBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[AddResponse]
    def __init__(self, responses: _Iterable[AddResponse | _Mapping] | None = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "flag", "master_key", "has_previous_lac", "previous_lac", "timeout_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    HAS_PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    flag: ReadFlag
    master_key: bytes
    has_previous_lac: bool
    previous_lac: int
    timeout_ms: int
    def __init__(self, ledger_id: int | None = ..., entry_id: int | None = ..., flag: ReadFlag | str | None = ..., master_key: bytes | None = ..., has_previous_lac: bool | None = ..., previous_lac: int | None = ..., timeout_ms: int | None = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "entry_id", "body", "max_lac", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    MAX_LAC_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    entry_id: int
    body: bytes
    max_lac: int
    detail: str
    def __init__(self, status: StatusCode | str | None = ..., ledger_id: int | None = ..., entry_id: int | None = ..., body: bytes | None = ..., max_lac: int | None = ..., detail: str | None = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "max_bytes")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_bytes: int
    def __init__(self, ledger_id: int | None = ..., first_entry_id: int | None = ..., last_entry_id: int | None = ..., max_bytes: int | None = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "first_entry_id", "bodies", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    first_entry_id: int
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    detail: str
    def __init__(self, status: StatusCode | str | None = ..., ledger_id: int | None = ..., first_entry_id: int | None = ..., bodies: _Iterable[bytes] | None = ..., detail: str | None = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: int | None = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "lac_body", "last_entry_body", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_BODY_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_BODY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    lac_body: bytes
    last_entry_body: bytes
    detail: str
    def __init__(self, status: StatusCode | str | None = ..., ledger_id: int | None = ..., lac_body: bytes | None = ..., last_entry_body: bytes | None = ..., detail: str | None = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "lac", "master_key", "body")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    lac: int
    master_key: bytes
    body: bytes
    def __init__(self, ledger_id: int | None = ..., lac: int | None = ..., master_key: bytes | None = ..., body: bytes | None = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    detail: str
    def __init__(self, status: StatusCode | str | None = ..., ledger_id: int | None = ..., detail: str | None = ...) -> None: ...

class BookieInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BookieInfoResponse(_message.Message):
    __slots__ = ("status", "free_disk_bytes", "total_disk_bytes", "read_only", "bookie_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    free_disk_bytes: int
    total_disk_bytes: int
    read_only: bool
    bookie_id: str
    def __init__(self, status: StatusCode | str | None = ..., free_disk_bytes: int | None = ..., total_disk_bytes: int | None = ..., read_only: bool | None = ..., bookie_id: str | None = ...) -> None: ...

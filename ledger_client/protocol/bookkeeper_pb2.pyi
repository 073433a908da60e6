from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

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
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., flag: _Optional[_Union[AddFlag, str]] = ..., master_key: _Optional[bytes] = ..., body: _Optional[bytes] = ..., request_id: _Optional[int] = ...) -> None: ...

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
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., request_id: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class LedgerAdds(_message.Message):
    __slots__ = ("ledger_id", "flag", "master_key", "entry_ids", "request_ids", "bodies", "lac_body")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    LAC_BODY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    flag: AddFlag
    master_key: bytes
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    request_ids: _containers.RepeatedScalarFieldContainer[int]
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    lac_body: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., flag: _Optional[_Union[AddFlag, str]] = ..., master_key: _Optional[bytes] = ..., entry_ids: _Optional[_Iterable[int]] = ..., request_ids: _Optional[_Iterable[int]] = ..., bodies: _Optional[_Iterable[bytes]] = ..., lac_body: _Optional[bytes] = ...) -> None: ...

class AddBatch(_message.Message):
    __slots__ = ("adds", "ledger_adds", "auth_token")
    ADDS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ADDS_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    adds: _containers.RepeatedCompositeFieldContainer[AddRequest]
    ledger_adds: _containers.RepeatedCompositeFieldContainer[LedgerAdds]
    auth_token: str
    def __init__(self, adds: _Optional[_Iterable[_Union[AddRequest, _Mapping]]] = ..., ledger_adds: _Optional[_Iterable[_Union[LedgerAdds, _Mapping]]] = ..., auth_token: _Optional[str] = ...) -> None: ...

class AddBatchResponse(_message.Message):
    __slots__ = ("responses", "ok_request_ids")
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    OK_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[AddResponse]
    ok_request_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, responses: _Optional[_Iterable[_Union[AddResponse, _Mapping]]] = ..., ok_request_ids: _Optional[_Iterable[int]] = ...) -> None: ...

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
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., flag: _Optional[_Union[ReadFlag, str]] = ..., master_key: _Optional[bytes] = ..., has_previous_lac: _Optional[bool] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

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
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., body: _Optional[bytes] = ..., max_lac: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "max_bytes", "entry_ids", "request_id", "wait_for_lac", "previous_lac", "timeout_ms", "auth_token", "ids_only")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_LAC_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTH_TOKEN_FIELD_NUMBER: _ClassVar[int]
    IDS_ONLY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_bytes: int
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    request_id: int
    wait_for_lac: bool
    previous_lac: int
    timeout_ms: int
    auth_token: str
    ids_only: bool
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., max_bytes: _Optional[int] = ..., entry_ids: _Optional[_Iterable[int]] = ..., request_id: _Optional[int] = ..., wait_for_lac: _Optional[bool] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., auth_token: _Optional[str] = ..., ids_only: _Optional[bool] = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "first_entry_id", "bodies", "detail", "entry_ids", "request_id", "lac")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    first_entry_id: int
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    detail: str
    entry_ids: _containers.RepeatedScalarFieldContainer[int]
    request_id: int
    lac: int
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., bodies: _Optional[_Iterable[bytes]] = ..., detail: _Optional[str] = ..., entry_ids: _Optional[_Iterable[int]] = ..., request_id: _Optional[int] = ..., lac: _Optional[int] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

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
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., lac_body: _Optional[bytes] = ..., last_entry_body: _Optional[bytes] = ..., detail: _Optional[str] = ...) -> None: ...

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
    def __init__(self, ledger_id: _Optional[int] = ..., lac: _Optional[int] = ..., master_key: _Optional[bytes] = ..., body: _Optional[bytes] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "detail")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    detail: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class BookieInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BookieInfoResponse(_message.Message):
    __slots__ = ("status", "free_disk_bytes", "total_disk_bytes", "read_only", "bookie_id", "add_port")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    ADD_PORT_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    free_disk_bytes: int
    total_disk_bytes: int
    read_only: bool
    bookie_id: str
    add_port: int
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., free_disk_bytes: _Optional[int] = ..., total_disk_bytes: _Optional[int] = ..., read_only: _Optional[bool] = ..., bookie_id: _Optional[str] = ..., add_port: _Optional[int] = ...) -> None: ...

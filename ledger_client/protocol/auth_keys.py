"""Where a token travels on gRPC (docs/security.md): the names both the client and the bookie use.

A call carries the token in its `authorization` metadata as `Bearer <token>`; a call that only an
admin may make also carries `x-spark-bookie-role: admin`, and the bookie serves it only for an
admin token (how the shell's destructive commands have their caller's role confirmed).
"""

TOKEN_KEY = "authorization"        # gRPC metadata keys are lower case
ROLE_KEY = "x-spark-bookie-role"
BEARER = "Bearer "

"""The one wire protocol, shared by the client and the bookie: `bookkeeper.proto` and its generated
code, entry framing and digests, the TCP port's framing, and the `invariant()` helper."""

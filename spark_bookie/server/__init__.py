"""The bookie process and its request semantics (BookKeeper's `bookie` package): configuration,
the gRPC service and TCP add/read port, the request processor (master keys, fencing, LAC, long
polls), checkpoints, cookies, the disk monitor and ZooKeeper registration. With `storage/` this is
the bookie proper: it imports only `ledger_client.protocol` and `metadata` from the project."""

"""The cache server: one process per user that holds the entries and answers the clients (imported only by the
server process and the CLI; never torch)."""

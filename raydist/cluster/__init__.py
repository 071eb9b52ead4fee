"""The cluster contract every client reads: the connection file, the Ray dashboard's HTTP client, the watch on
nodes and stop requests, the embedded instance's token, a free port."""

package main

import "github.com/softrnic/softrnic/internal/streamtool"

// testOptions are rstream's -T options, as it reads them.
var testOptions = []streamtool.TestOption{
	{Letter: 's', Word: "socket", What: "use the kernel's TCP sockets (Go's net package), no rsockets"},
	{Letter: 'a', Word: "async", What: "asynchronous operation (poll)", Note: "Go's reads and writes block their goroutine: there is nothing to poll"},
	{Letter: 'b', Word: "block", What: "blocking calls", Note: "Go's reads and writes are blocking calls"},
	{Letter: 'f', Word: "fork", What: "fork the server's processing (implies s)", Note: "the server serves each connection itself, without forking"},
	{Letter: 'n', Word: "nonblock", What: "non-blocking calls", Note: "Go's reads and writes block their goroutine (the runtime polls)"},
	{Letter: 'r', Word: "resolve", What: "resolve addresses through rdma_cm", Note: "softrnic's addresses are IP addresses, resolved as such"},
	{Letter: 'v', Word: "verify", What: "verify data"},
}

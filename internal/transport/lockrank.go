package transport

import "github.com/softrnic/softrnic/internal/lockrank"

// mutex is the engine's mutex: a sync.Mutex with its rank in the lock order the package
// doc writes out (the ranks: internal/lockrank). Built with the lockcheck tag
// (`go test -tags lockcheck`), every Lock checks the order against the locks the goroutine
// holds, the translation table's (tpt.Table.mu) among them, and panics on a violation.
type mutex = lockrank.Mutex

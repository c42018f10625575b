//go:build linux

package interop

import (
	"fmt"
	"io"
	"sync"
	"testing"
)

// The matrix the suite prints at its end: one row per tool, direction and mode, with its
// result.
var matrix struct {
	mu   sync.Mutex
	rows []matrixRow
}

type matrixRow struct {
	tool, server, mode, result string
}

// record adds t's result to the matrix when t ends: tool is the C tool, guestServer
// whether it was the server, mode what else distinguishes the cell.
func record(t *testing.T, tool string, guestServer bool, mode string) {
	server := "softrnic"
	if guestServer {
		server = "rxe"
	}
	t.Cleanup(func() {
		result := "pass"
		switch {
		case t.Failed():
			result = "FAIL"
		case t.Skipped():
			result = "skip"
		}
		matrix.mu.Lock()
		defer matrix.mu.Unlock()
		matrix.rows = append(matrix.rows, matrixRow{tool, server, mode, result})
	})
}

// printMatrix writes the matrix, if any cell ran.
func printMatrix(w io.Writer) {
	matrix.mu.Lock()
	defer matrix.mu.Unlock()
	if len(matrix.rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%-18s %-10s %-10s %-34s %s\n", "tool (rxe side)", "server", "client", "mode", "result")
	for _, r := range matrix.rows {
		client := "softrnic"
		if r.server == "softrnic" {
			client = "rxe"
		}
		fmt.Fprintf(w, "%-18s %-10s %-10s %-34s %s\n", r.tool, r.server, client, r.mode, r.result)
	}
}

package doccheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// block is one ```go block of a Markdown file.
type block struct {
	file  string // the Markdown file, relative to the module root
	fence int    // line of the opening ```go
	end   int    // line of the closing ```
	src   []byte
}

func (b block) String() string { return fmt.Sprintf("%s:%d", b.file, b.fence) }

// complete reports whether the block is a whole Go file (it has a package clause).
func (b block) complete() bool {
	_, err := parser.ParseFile(token.NewFileSet(), "", b.src, parser.PackageClauseOnly)
	return err == nil
}

// The names a fragment may use without declaring them: the objects a verbs, cm or msg
// program has at hand, under the names the documentation gives them.
const fragmentParams = `ctx context.Context, // a context.Context
	dev *verbs.Device, // an open device (verbs.OpenDevice)
	pd *verbs.PD,
	cq *verbs.CQ,
	qp *verbs.QP,
	srq *verbs.SRQ,
	mr *verbs.MR,
	buf []byte, // registered as mr
	wc []verbs.WorkCompletion,
	peer verbs.Endpoint, // the peer QP's endpoint, learnt out of band
	comm *msg.Comm, // a rank (msg.Init)
`

// The packages a fragment may use without importing them.
const fragmentImports = `import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/msg"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/srqmgr"
	"github.com/softrnic/softrnic/verbs"
)

var (
	_ = context.Background
	_ = errors.Is
	_ = fmt.Sprint
	_ = io.Copy
	_ = log.Fatal
	_ = net.Dial
	_ = http.ListenAndServe
	_ = netip.MustParseAddr
	_ = os.Exit
	_ = time.Second
	_ = cm.Listen
	_ = msg.Init
	_ = rsocket.Listen
	_ = srqmgr.Start
	_ = verbs.OpenDevice
)
`

// TestGoBlocks compiles every ```go block of README.md and docs/*.md against the module,
// with one go build for all of them, and fails naming the file and line of each block
// that does not compile. The conventions a block follows:
//
//   - A block with a package clause is a complete Go file (a program, package main, or
//     a package of its own). It is compiled as it is, in a directory of its own.
//
//   - Any other block is a fragment: a list of statements, compiled as the body of a
//     function (a block of its own inside it, so it may redeclare the names below) that
//     has these names at hand without declaring them:
//
//     ctx context.Context, dev *verbs.Device (an open device), pd *verbs.PD,
//     cq *verbs.CQ, qp *verbs.QP, srq *verbs.SRQ, mr *verbs.MR, buf []byte,
//     wc []verbs.WorkCompletion, peer verbs.Endpoint (the peer QP's, learnt out of
//     band), comm *msg.Comm (a rank)
//
//     and these packages without importing them: context, errors, fmt, io, log, net,
//     net/http, net/netip, os, time, and the module's cm, msg, rsocket, srqmgr and
//     verbs. Whatever else a fragment uses it declares, and whatever it declares it uses
//     (Go's rule for local variables).
//
//   - Every block is formatted as gofmt formats it.
//
//   - No block imports the module's internal packages: the documentation shows what a
//     user of the module can write.
//
// Blocks of any other language (```sh, plain ```) are not checked. The blocks are put
// into the module's tree only through go build's -overlay flag (nothing is written to
// the source tree), each under a //line directive, so that the compiler's errors name
// the Markdown file and line.
func TestGoBlocks(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command:", err)
	}
	root, modPath := moduleRoot(t)
	files := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, filepath.ToSlash(rel))
	}

	var blocks []block
	for _, f := range files {
		bs, err := extract(root, f)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, bs...)
	}
	if len(blocks) == 0 {
		t.Fatal("no ```go block in README.md or docs/*.md: is the extraction broken?")
	}

	tmp := t.TempDir()
	overlay := map[string]string{}
	pkgs := map[string]bool{}
	fragments := map[string]int{} // Markdown file -> fragments so far
	for i, b := range blocks {
		if formatted, err := format.Source(b.src); err != nil {
			t.Errorf("%v: block does not parse: %v", b, err)
			continue
		} else if !bytes.Equal(formatted, b.src) {
			t.Errorf("%v: block is not gofmt-formatted; gofmt gives:\n%s", b, formatted)
		}
		mdPath := filepath.Join(root, filepath.FromSlash(b.file))
		var dir, name string
		var src bytes.Buffer
		if b.complete() {
			f, err := parser.ParseFile(token.NewFileSet(), "", b.src, parser.ImportsOnly)
			if err != nil {
				t.Errorf("%v: %v", b, err)
				continue
			}
			for _, im := range f.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				if p == modPath+"/internal" || strings.HasPrefix(p, modPath+"/internal/") {
					t.Errorf("%v: imports %s, which users of the module cannot", b, p)
				}
			}
			dir = fmt.Sprintf("b%03d", i)
			name = "main.go"
			fmt.Fprintf(&src, "//line %s:%d\n", mdPath, b.fence+1)
			src.Write(b.src)
		} else {
			dir = "f_" + slug(b.file)
			fragments[b.file]++
			name = fmt.Sprintf("f%03d.go", fragments[b.file])
			src.WriteString("package blocks\n\n" + fragmentImports)
			fmt.Fprintf(&src, "\nfunc block%d(%s) {\n{\n", b.fence, fragmentParams)
			fmt.Fprintf(&src, "//line %s:%d\n", mdPath, b.fence+1)
			src.Write(b.src)
			fmt.Fprintf(&src, "//line %s:%d\n}\n}\n", mdPath, b.end)
		}
		backing := filepath.Join(tmp, dir+"_"+name)
		if err := os.WriteFile(backing, src.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(root, "internal", "doccheck", "blocks", dir, name)] = backing
		pkgs["./internal/doccheck/blocks/"+dir] = true
	}
	if len(pkgs) == 0 {
		return
	}

	ov, _ := json.Marshal(map[string]any{"Replace": overlay})
	ovFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovFile, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	var list []string
	for p := range pkgs {
		list = append(list, p)
	}
	sort.Strings(list)
	// -gcflags=-e: every error of a package, not its first ten. Given several packages, go
	// build compiles and links them all and writes nothing; given one, it would write a
	// program into the module's root, hence -o. (-o with a directory would skip the
	// packages that are not programs.)
	args := []string{"build", "-overlay", ovFile, "-gcflags=-e"}
	if len(list) == 1 {
		args = append(args, "-o", os.DevNull)
	}
	cmd := exec.CommandContext(t.Context(), goCmd, append(args, list...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Logf("%d Go blocks compiled (%d packages)", len(blocks), len(list))
		return
	}
	failing := blocksIn(out, root, blocks)
	if len(failing) == 0 {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, b := range failing {
		t.Errorf("%v: the Go block starting here does not compile", b)
	}
	t.Errorf("go build says:\n%s", out)
}

// moduleRoot finds the module's root directory (two levels above this package) and path.
func moduleRoot(t *testing.T) (dir, path string) {
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(mod)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return dir, strings.Trim(strings.TrimSpace(p), `"`)
		}
	}
	t.Fatal("go.mod has no module line")
	return "", ""
}

// extract returns the ```go blocks of a Markdown file. A fence may be indented (a block
// in a list item); the fence's indentation is taken off the block's lines.
func extract(root, file string) ([]block, error) {
	f, err := os.Open(filepath.Join(root, filepath.FromSlash(file)))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks []block
		cur    *block
		indent string
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur == nil {
			if trimmed == "```go" {
				indent = line[:strings.Index(line, "```")]
				cur = &block{file: file, fence: n}
			}
			continue
		}
		if trimmed == "```" {
			cur.end = n
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		cur.src = append(cur.src, strings.TrimPrefix(line, indent)...)
		cur.src = append(cur.src, '\n')
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%v: ```go block never closed", *cur)
	}
	return blocks, nil
}

var mdPos = regexp.MustCompile(`([^\s:]+\.md):(\d+)`)

// blocksIn returns the blocks that the compiler's output points into.
func blocksIn(out []byte, root string, blocks []block) []block {
	var failing []block
	seen := map[int]bool{}
	for _, m := range mdPos.FindAllSubmatch(out, -1) {
		file := string(m[1])
		line, _ := strconv.Atoi(string(m[2]))
		for i, b := range blocks {
			if !seen[i] && sameFile(root, file, b.file) && b.fence < line && line <= b.end {
				seen[i] = true
				failing = append(failing, b)
			}
		}
	}
	return failing
}

// sameFile reports whether a path from the compiler's output (absolute, or relative to
// the module root, perhaps with ./) names the Markdown file rel.
func sameFile(root, path, rel string) bool {
	if !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	return filepath.Clean(path) == filepath.Join(root, filepath.FromSlash(rel))
}

// slug turns a Markdown file's path into a directory name.
func slug(file string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r - 'A' + 'a'
		}
		return '_'
	}, strings.TrimSuffix(file, ".md"))
}

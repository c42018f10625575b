package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// mdLink is an inline Markdown link or image: [text](target) or ![alt](target).
var mdLink = regexp.MustCompile(`\]\(([^()\s]+)\)`)

// TestLinks: every relative link in the module's Markdown files (README.md, docs/, the
// READMEs of its directories and the run logs in bench/results/) names a file or
// directory that exists, and a link to a heading of a Markdown file (file.md#heading, or
// #heading within the file) names a heading that file has, as GitHub makes anchors.
// Links with a scheme (https:, mailto:) are not followed. Code spans and fenced blocks
// are left out: a link there is text.
func TestLinks(t *testing.T) {
	root, _ := moduleRoot(t)
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := headingAnchors(t, path)
		anchors[path] = a
		return a
	}
	checked := 0
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		for _, l := range linksIn(t, f) {
			if strings.Contains(l.target, ":") && !strings.HasPrefix(l.target, "#") {
				continue // a URL
			}
			checked++
			target, anchor, _ := strings.Cut(l.target, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), filepath.FromSlash(target))
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: link to %s: no such file or directory", rel, l.line, l.target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[anchor] {
				t.Errorf("%s:%d: link to %s: no heading with that anchor", rel, l.line, l.target)
			}
		}
	}
	t.Logf("%d relative links in %d Markdown files", checked, len(files))
}

type link struct {
	line   int
	target string
}

// linksIn returns the links of a Markdown file outside code spans and fenced blocks.
func linksIn(t *testing.T, path string) []link {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []link
	fenced := false
	for i, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(withoutCodeSpans(line), -1) {
			out = append(out, link{i + 1, m[1]})
		}
	}
	return out
}

// withoutCodeSpans blanks out `code spans` of a line.
func withoutCodeSpans(line string) string {
	parts := strings.Split(line, "`")
	for i := 1; i < len(parts); i += 2 {
		parts[i] = ""
	}
	return strings.Join(parts, "``")
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown file:
// lower case, spaces to hyphens, punctuation other than hyphens and underscores dropped,
// and -1, -2... appended to repeats.
func headingAnchors(t *testing.T, path string) map[string]bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var s strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				s.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				s.WriteRune(r)
			}
		}
		slug := s.String()
		if n := seen[slug]; n > 0 {
			a[slug+"-"+strconv.Itoa(n)] = true
		} else {
			a[slug] = true
		}
		seen[slug]++
	}
	return a
}

package localcluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// filePatch is a unified diff of one file.
type filePatch struct {
	path  string // the file's path inside its module, from the "+++ b/<path>" line
	hunks []hunk
}

// hunk is one "@@ -a,b +c,d @@" section of a unified diff.
type hunk struct {
	// oldStart is the 1-based line of the first old line; when oldLen is 0 (a hunk that only
	// adds lines, as "diff -U0" writes one) it is the line after which the new lines go, 0
	// meaning before the first.
	oldStart int
	oldLen   int      // how many old lines the hunk covers (context and removed)
	lines    []string // each with its ' ', '-' or '+' mark
}

// parsePatch parses a unified diff of exactly one file, as "diff -u" writes it. Paths are
// taken from the "+++" line without its "b/" prefix.
func parsePatch(data []byte) (*filePatch, error) {
	var p filePatch
	s := bufio.NewScanner(bytes.NewReader(data))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	var cur *hunk
	var oldLeft, newLeft int
	for n := 1; s.Scan(); n++ {
		line := s.Text()
		switch {
		case cur != nil && (oldLeft > 0 || newLeft > 0):
			if line == "" {
				line = " " // an empty context line whose space an editor dropped
			}
			switch line[0] {
			case ' ':
				oldLeft--
				newLeft--
			case '-':
				oldLeft--
			case '+':
				newLeft--
			case '\\':
				continue // "\ No newline at end of file"
			default:
				return nil, fmt.Errorf("line %d: %q inside a hunk", n, line)
			}
			if oldLeft < 0 || newLeft < 0 {
				return nil, fmt.Errorf("line %d: hunk longer than its header says", n)
			}
			cur.lines = append(cur.lines, line)
		case strings.HasPrefix(line, "--- "):
		case strings.HasPrefix(line, "+++ "):
			if p.path != "" {
				return nil, fmt.Errorf("line %d: a second file; one patch per file", n)
			}
			path, _, _ := strings.Cut(strings.TrimPrefix(line, "+++ "), "\t")
			p.path = strings.TrimPrefix(strings.TrimSpace(path), "b/")
		case strings.HasPrefix(line, "@@ "):
			var h hunk
			var err error
			if h.oldStart, oldLeft, newLeft, err = parseHunkHeader(line); err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			if h.oldLen = oldLeft; h.oldLen > 0 && h.oldStart == 0 {
				return nil, fmt.Errorf("line %d: hunk %q covers old lines from line 0", n, line)
			}
			p.hunks = append(p.hunks, h)
			cur = &p.hunks[len(p.hunks)-1]
		default:
			if cur != nil {
				return nil, fmt.Errorf("line %d: %q after the end of a hunk", n, line)
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	switch {
	case p.path == "":
		return nil, errors.New("no +++ line")
	case len(p.hunks) == 0:
		return nil, errors.New("no hunk")
	case oldLeft > 0 || newLeft > 0:
		return nil, errors.New("last hunk shorter than its header says")
	}
	return &p, nil
}

// parseHunkHeader parses "@@ -a,b +c,d @@ ..." into a, b and d.
func parseHunkHeader(line string) (oldStart, oldLen, newLen int, err error) {
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "@@" || f[3] != "@@" || !strings.HasPrefix(f[1], "-") || !strings.HasPrefix(f[2], "+") {
		return 0, 0, 0, fmt.Errorf("bad hunk header %q", line)
	}
	rng := func(s string) (start, n int, err error) {
		a, b, found := strings.Cut(s[1:], ",")
		if start, err = strconv.Atoi(a); err != nil {
			return 0, 0, err
		}
		n = 1
		if found {
			n, err = strconv.Atoi(b)
		}
		return start, n, err
	}
	oldStart, oldLen, err = rng(f[1])
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bad hunk header %q: %w", line, err)
	}
	_, newLen, err = rng(f[2])
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bad hunk header %q: %w", line, err)
	}
	return oldStart, oldLen, newLen, nil
}

// apply returns src with p applied. Every hunk must match src exactly at the line its header
// names: no offset, no fuzz, so that a patch written for one release of a file fails loudly
// against any other, naming the first line that differs. Hunks without context lines are
// placed as "git apply --unidiff-zero" and patch(1) place them: "-l,0" inserts after old
// line l. The result ends in a newline if it has lines and src did, or src was empty
// ("\ No newline at end of file" markers are not honoured).
func (p *filePatch) apply(src []byte) ([]byte, error) {
	text := string(src)
	trailingNewline := text == "" || strings.HasSuffix(text, "\n")
	var old []string
	if text != "" {
		old = strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	}
	var out []string
	next := 0 // index in old of the first line not yet copied
	for i, h := range p.hunks {
		start := h.oldStart - 1 // index in old of the hunk's first old line
		if h.oldLen == 0 {
			start = h.oldStart // an insertion goes after old line oldStart
		}
		if start < next {
			return nil, fmt.Errorf("%s: hunk %d overlaps the one before", p.path, i+1)
		}
		if start > len(old) {
			return nil, fmt.Errorf("%s: hunk %d starts at line %d, past the end (%d lines)", p.path, i+1, h.oldStart, len(old))
		}
		out = append(out, old[next:start]...)
		at := start
		for _, l := range h.lines {
			mark, body := l[0], l[1:]
			if mark == '+' {
				out = append(out, body)
				continue
			}
			if at >= len(old) || old[at] != body {
				got := "end of file"
				if at < len(old) {
					got = strconv.Quote(old[at])
				}
				return nil, fmt.Errorf("%s: hunk %d does not apply: line %d is %s, the patch expects %q", p.path, i+1, at+1, got, body)
			}
			if mark == ' ' {
				out = append(out, body)
			}
			at++
		}
		next = at
	}
	out = append(out, old[next:]...)
	res := strings.Join(out, "\n")
	if trailingNewline && len(out) > 0 {
		res += "\n"
	}
	return []byte(res), nil
}

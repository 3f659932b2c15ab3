package replay

import (
	"strings"
	"unicode/utf8"
)

// Snippet is the first line of s, cut to n runes: how the CLI's tables and
// the console show a last error or a reason in one cell.
func Snippet(s string, n int) string {
	s, _, cut := strings.Cut(strings.TrimSpace(s), "\n")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n])
		cut = true
	}
	if cut {
		s += "…"
	}
	return s
}

package mask

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
)

// cutPrefixMin is the shortest start of a masked value that Text removes
// from the end of a text: a text cut short (classify bounds error
// messages) may end inside a quoted value.
const cutPrefixMin = 3

// Text is text with every form of payload's masked values replaced by
// Marker. When payload is not JSON its values are unknown, and the whole
// text is hidden.
func (m *Mask) Text(payload []byte, text string) string {
	if m.Empty() || text == "" {
		return text
	}
	v, err := decode(payload)
	if err != nil {
		return Marker + " (the error text is hidden: the payload it may quote is not JSON)"
	}
	forms := map[string]bool{}
	m.walk(v, m.start(), func(leaf any) any {
		for _, f := range spellings(leaf) {
			forms[f] = true
		}
		return leaf
	})
	if len(forms) == 0 {
		return text
	}
	// Longest first, so that a value is replaced whole before a shorter
	// value inside it could split it.
	ordered := slices.SortedFunc(func(yield func(string) bool) {
		for f := range forms {
			if !yield(f) {
				return
			}
		}
	}, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	// Only the forms the text holds go into the replacer: a payload may
	// mask thousands of values, and building a replacer of them all costs
	// more than looking for each.
	var pairs []string
	for _, f := range ordered {
		if strings.Contains(text, f) {
			pairs = append(pairs, f, Marker)
		}
	}
	if len(pairs) > 0 {
		text = strings.NewReplacer(pairs...).Replace(text)
	}
	return cutTail(text, ordered)
}

// cutTail hides the end of text when it is the start of a masked form:
// what is left of a value where the text was cut short.
func cutTail(text string, forms []string) string {
	cut := ""
	for _, ellipsis := range []string{"…", "..."} {
		if t, ok := strings.CutSuffix(text, ellipsis); ok {
			text, cut = t, ellipsis
			break
		}
	}
	// The longest such end first: from the text's left, the first suffix
	// that starts a form. Most comparisons fail on their first byte.
	best := 0
	for i := 0; best == 0 && len(text)-i >= cutPrefixMin; i++ {
		for _, f := range forms {
			if len(f) > len(text)-i && strings.HasPrefix(f, text[i:]) {
				best = len(text) - i
				break
			}
		}
	}
	if best == 0 {
		return text + cut
	}
	return text[:len(text)-best] + Marker + cut
}

// spellings are the forms a leaf may take in a text: as is, and as JSON,
// Go and Java print it.
func spellings(leaf any) []string {
	switch x := leaf.(type) {
	case string:
		return stringForms(x)
	case json.Number:
		return numberForms(x)
	case bool:
		return []string{strconv.FormatBool(x)}
	}
	return nil // null quotes nothing
}

func stringForms(s string) []string {
	if s == "" {
		return nil
	}
	quoted := []string{s}
	html, _ := json.Marshal(s)
	quoted = append(quoted, string(html[1:len(html)-1]))
	plain := strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&").Replace(string(html[1 : len(html)-1]))
	ascii := strconv.QuoteToASCII(s)
	ascii = ascii[1 : len(ascii)-1]
	quoted = append(quoted, plain, ascii, strings.ToUpper(ascii), unicodeUpper(ascii))
	goq := strconv.Quote(s)
	return append(quoted, goq[1:len(goq)-1])
}

// unicodeUpper is s with the hex digits of its \u escapes upper-cased, as
// Java's JSON writers print them, the rest as it is.
func unicodeUpper(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.HasPrefix(s[i:], `\u`) && i+6 <= len(s) {
			b.WriteString(`\u` + strings.ToUpper(s[i+2:i+6]))
			i += 5
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// numberForms are a number as written and as an engine may print it
// back: 1e3 as 1000 or 1000.0, 5 as 5.0.
func numberForms(n json.Number) []string {
	forms := []string{n.String()}
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil {
		return forms
	}
	forms = append(forms, strconv.FormatFloat(f, 'f', -1, 64), strconv.FormatFloat(f, 'g', -1, 64),
		strconv.FormatFloat(f, 'E', -1, 64))
	if f == math.Trunc(f) && math.Abs(f) < 1e18 {
		forms = append(forms, strconv.FormatInt(int64(f), 10), strconv.FormatInt(int64(f), 10)+".0")
	}
	return forms
}

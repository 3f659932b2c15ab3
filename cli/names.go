package cli

import (
	"reflect"
	"strings"
	"unicode"

	"github.com/wlproj/wlproj/internal/bounds"
)

// A flag's `field` tag names the package Config (or request) field it sets,
// so that the package's *bounds.FieldError, which names the Go field, is
// reported as the operator set it: the environment variable where the flag
// has one (the daemon is configured by its environment), else the flag.
// This is the one place a Go field becomes an operator's word.

// renameFields rewrites a *bounds.FieldError in err with cmd's flag names.
func renameFields(cmd any, err error) error {
	return bounds.Rename(err, flagNames(cmd))
}

// flagNames maps each `field` tag of cmd's flags (embedded structs
// included) to the flag's variable, or its --name where it has none.
func flagNames(cmd any) map[string]string {
	names := map[string]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			if field, ok := f.Tag.Lookup("field"); ok {
				names[field] = operatorName(f)
			}
		}
	}
	walk(reflect.Indirect(reflect.ValueOf(cmd)).Type())
	return names
}

// operatorName is f's environment variable, or else its flag as kong names
// it: the `name` tag, or the Go name in kebab case.
func operatorName(f reflect.StructField) string {
	if env := f.Tag.Get("env"); env != "" {
		return env
	}
	if name := f.Tag.Get("name"); name != "" {
		return "--" + name
	}
	return "--" + kebab(f.Name)
}

// kebab is kong's default flag name for a Go field: BulkSize → bulk-size.
func kebab(s string) string {
	var b strings.Builder
	runes := []rune(s)
	for i, r := range runes {
		if i > 0 && unicode.IsUpper(r) && (unicode.IsLower(runes[i-1]) ||
			(i+1 < len(runes) && unicode.IsLower(runes[i+1]))) {
			b.WriteByte('-')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

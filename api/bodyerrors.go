package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// bodyErrorMessage says in plain words why a JSON request body could not be
// decoded into v (a pointer to the body's struct): which field, what was
// expected and what came, or where the JSON is broken. body is the whole
// request body; err is what json.Decoder.Decode returned for it.
func bodyErrorMessage(body []byte, v any, err error) string {
	if se, ok := errors.AsType[*json.SyntaxError](err); ok {
		return "request body is not valid JSON: " + syntaxWords(se)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "request body is not valid JSON: it ends too early (an unclosed {, [ or string?)"
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return typeWords(reflect.TypeOf(v), te)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return unknownFieldWords(body, reflect.TypeOf(v), name)
	}
	return "request body: " + err.Error()
}

// syntaxContexts turn the end of encoding/json's syntax error messages
// ("invalid character 'x' <context>") into where it happened.
var syntaxContexts = []struct{ goWords, words string }{
	{"looking for beginning of value", "where a value should start (a string needs double quotes)"},
	{"looking for beginning of object key string", `where a field name in double quotes should start (no trailing comma before "}")`},
	{"after object key:value pair", `after a field's value (expected "," or "}")`},
	{"after object key", `after a field name (expected ":")`},
	{"after array element", `after an array element (expected "," or "]")`},
	{"in string literal", "inside a string (control characters must be escaped)"},
	{"in string escape code", `in a string's \ escape`},
	{"in \\u hexadecimal character escape", `in a string's \u escape`},
	{"in numeric literal", "in a number"},
	{"after decimal point in numeric literal", "in a number"},
	{"in exponent of numeric literal", "in a number"},
	{"after top-level value", "after the JSON value"},
}

// syntaxWords renders a syntax error as "unexpected character 'o' at byte 2
// (in the literal null)", bytes counted from 1.
func syntaxWords(se *json.SyntaxError) string {
	msg := se.Error()
	rest, ok := strings.CutPrefix(msg, "invalid character ")
	if !ok {
		return fmt.Sprintf("%s at byte %d", msg, se.Offset)
	}
	// The character is quoted: 'x', '\'' or an escape like '\x01'.
	end := strings.IndexByte(rest[1:], '\'') + 2
	if strings.HasPrefix(rest, `'\''`) {
		end = 4
	}
	if end < 2 || end > len(rest) {
		return fmt.Sprintf("%s at byte %d", msg, se.Offset)
	}
	char, context := rest[:end], strings.TrimSpace(rest[end:])
	where := context
	for _, c := range syntaxContexts {
		if context == c.goWords {
			where = c.words
			break
		}
	}
	if lit, ok := strings.CutPrefix(context, "in literal "); ok {
		// "in literal null (expecting 'u')": a bare word that starts like
		// true, false or null.
		lit, _, _ = strings.Cut(lit, " ")
		where = "in what starts like " + lit + " (a string needs double quotes)"
	}
	return fmt.Sprintf("unexpected character %s at byte %d %s", char, se.Offset, where)
}

// typeWords renders a type mismatch: "ports: expected an array of whole
// numbers, got a string", or for an element of an array or object "ports:
// expected an array of whole numbers, but an element is a string".
func typeWords(t reflect.Type, te *json.UnmarshalTypeError) string {
	if te.Field == "" {
		return "request body: expected a JSON object, got " + gotWords(te.Value, te.Type)
	}
	ft := fieldType(t, te.Field)
	if ft == nil {
		ft = te.Type
	}
	msg := fmt.Sprintf("%s: expected %s, ", te.Field, typeDesc(ft))
	for ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	switch {
	case ft == te.Type || (ft.Kind() != reflect.Slice && ft.Kind() != reflect.Map):
		return msg + "got " + gotWords(te.Value, te.Type)
	case ft.Kind() == reflect.Map:
		return msg + "but a value is " + gotWords(te.Value, te.Type)
	default:
		return msg + "but an element is " + gotWords(te.Value, te.Type)
	}
}

// fieldType finds the type of the field at a JSON path ("a.b") in struct
// type t, nil if there is none.
func fieldType(t reflect.Type, path string) reflect.Type {
	for name := range strings.SplitSeq(path, ".") {
		// encoding/json's path names struct fields only: a map's key or
		// a slice's index is not in it.
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Map || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		f, ok := fieldByJSON(t, name, false)
		if !ok {
			return nil
		}
		t = f.Type
	}
	return t
}

// jsonName is the name encoding/json gives struct field f; false for a
// field it leaves out.
func jsonName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	switch name {
	case "-":
		return "", false
	case "":
		return f.Name, true
	}
	return name, true
}

// jsonFields are the JSON names of struct type t's fields, in order.
func jsonFields(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		if name, ok := jsonName(f); ok {
			names = append(names, name)
		}
	}
	return names
}

// fieldByJSON finds the field of struct type t named name in JSON; with
// fold, in any case (the field encoding/json decodes name into).
func fieldByJSON(t reflect.Type, name string, fold bool) (reflect.StructField, bool) {
	for f := range t.Fields() {
		if n, ok := jsonName(f); ok && (n == name || (fold && strings.EqualFold(n, name))) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// typeDesc says what JSON a Go type takes: "a string", "an array of whole
// numbers", "an object of strings".
func typeDesc(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array of " + pluralDesc(t.Elem())
	case reflect.Map:
		return "an object of " + pluralDesc(t.Elem())
	case reflect.Struct:
		return "a JSON object"
	}
	return "a " + t.String()
}

func pluralDesc(t reflect.Type) string {
	switch d := typeDesc(t); d {
	case "a string":
		return "strings"
	case "a whole number":
		return "whole numbers"
	case "a number":
		return "numbers"
	case "true or false":
		return "true/false values"
	case "a JSON object":
		return "JSON objects"
	default:
		return "values"
	}
}

// gotWords renders the value of a type error (encoding/json says "string",
// "number", "number 1.5", "bool", "array", "object") for target type t.
func gotWords(value string, t reflect.Type) string {
	if num, ok := strings.CutPrefix(value, "number "); ok {
		switch t.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			if strings.ContainsAny(num, ".eE") {
				return num + ", not a whole number"
			}
		}
		return num + ", out of range"
	}
	switch value {
	case "array", "object":
		return "an " + value
	case "bool":
		return "true or false"
	case "":
		return "something else"
	}
	return "a " + value
}

// unknownFieldWords names the body's unknown fields (all of them, not only
// the first the decoder met) and the fields there are, in the object that
// has them: "services.db: unknown field "imgae" (fields: image, …)" for a
// nested one. quoted is the first one as encoding/json quotes it.
func unknownFieldWords(body []byte, t reflect.Type, quoted string) string {
	var found []unknownField
	findUnknown(body, t, "", &found)
	// The object the decoder stopped in: the one holding the field it
	// named (encoding/json does not say where that is).
	at := slices.IndexFunc(found, func(u unknownField) bool { return fmt.Sprintf("%q", u.name) == quoted })
	path, in := "", t
	if at >= 0 {
		path, in = found[at].path, found[at].in
	}
	for in.Kind() == reflect.Pointer {
		in = in.Elem()
	}
	var unknown []string
	for _, u := range found {
		if u.path == path {
			unknown = append(unknown, fmt.Sprintf("%q", u.name))
		}
	}
	slices.Sort(unknown)
	if len(unknown) == 0 {
		unknown = []string{quoted}
	}
	s := "unknown field "
	if len(unknown) > 1 {
		s = "unknown fields "
	}
	if path != "" {
		s = path + ": " + s
	}
	return s + strings.Join(unknown, ", ") + " (fields: " + strings.Join(jsonFields(in), ", ") + ")"
}

// unknownField is a field of a body that its type does not have: its name,
// the path of the object holding it ("" for the body, "services.db") and
// that object's struct type.
type unknownField struct {
	name, path string
	in         reflect.Type
}

// findUnknown walks the JSON value raw as type t decodes it and appends
// the fields no struct on the way knows, under path. Values that do not
// decode as t expects are passed over: the decoder reports those.
func findUnknown(raw []byte, t reflect.Type, path string, out *[]unknownField) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			// encoding/json matches names case-insensitively.
			f, ok := fieldByJSON(t, k, true)
			if !ok {
				*out = append(*out, unknownField{name: k, path: path, in: t})
				continue
			}
			findUnknown(obj[k], f.Type, join(k), out)
		}
	case reflect.Map:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		for _, k := range slices.Sorted(maps.Keys(obj)) {
			findUnknown(obj[k], t.Elem(), join(k), out)
		}
	case reflect.Slice, reflect.Array:
		var arr []json.RawMessage
		if json.Unmarshal(raw, &arr) != nil {
			return
		}
		for i, v := range arr {
			findUnknown(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
}

// duplicateKey finds the first object key given twice in body, a JSON
// value read as type t: encoding/json would keep the last silently
// (`{"id":"x1","id":"x2"}` made x2). In a struct's object two keys are
// the same when they fill the same field (encoding/json matches names in
// any case, so "id" and "ID" are one); in a map's, when they are equal.
// It answers the path of the object holding it ("" for the body,
// "services.db") and the key as given the second time; ok is false when
// there is none, or the JSON breaks first (the decoder reports that).
func duplicateKey(body []byte, t reflect.Type) (path, key string, ok bool) {
	w := dupWalker{dec: json.NewDecoder(bytes.NewReader(body))}
	key, ok, _ = w.walk(t)
	if !ok {
		return "", "", false
	}
	return w.found, key, true
}

// maxDupDepth bounds how deep walk follows a body's nesting: the API's
// bodies nest a few levels, and a body of a million '[' must cost neither
// a million frames nor a path per level (encoding/json, which would
// refuse it past 10,000, reads the body after this walk). Deeper values
// are not looked into; the decode that follows judges them.
const maxDupDepth = 64

// dupWalker reads one JSON value from dec and looks for a key given twice
// in its objects. The path is kept as segments and written out only for
// the duplicate found.
type dupWalker struct {
	dec   *json.Decoder
	segs  []string // the current path: keys, and "[i]" for elements
	found string   // the path of the object holding the duplicate
}

// path is segs as "services.db" or "allow[2]".
func (w *dupWalker) path() string {
	var b strings.Builder
	for _, s := range w.segs {
		if b.Len() > 0 && !strings.HasPrefix(s, "[") {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	return b.String()
}

// walk reads one value as type t (nil: any); err is dec's.
func (w *dupWalker) walk(t reflect.Type) (key string, found bool, err error) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := w.dec.Token()
	if err != nil {
		return "", false, err
	}
	delim, ok := tok.(json.Delim)
	if !ok || (delim != '{' && delim != '[') {
		return "", false, nil
	}
	if len(w.segs) >= maxDupDepth {
		return "", false, errTooDeep
	}
	if delim == '[' {
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; w.dec.More(); i++ {
			if key, found, err = w.child("["+strconv.Itoa(i)+"]", elem); found || err != nil {
				return key, found, err
			}
		}
		_, err = w.dec.Token()
		return "", false, err
	}
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return "", false, err
		}
		k, _ := tok.(string)
		// The name the key fills: a struct's field (in any case), else
		// the key itself.
		name, elem := "key "+k, reflect.Type(nil)
		switch {
		case t != nil && t.Kind() == reflect.Struct:
			if f, ok := fieldByJSON(t, k, true); ok {
				name, elem = "field "+f.Name, f.Type
			}
		case t != nil && t.Kind() == reflect.Map:
			elem = t.Elem()
		}
		if seen[name] {
			w.found = w.path()
			return k, true, nil
		}
		seen[name] = true
		if key, found, err = w.child(k, elem); found || err != nil {
			return key, found, err
		}
	}
	_, err = w.dec.Token()
	return "", false, err
}

// child walks the value at path segment seg, of type elem.
func (w *dupWalker) child(seg string, elem reflect.Type) (key string, found bool, err error) {
	w.segs = append(w.segs, seg)
	key, found, err = w.walk(elem)
	w.segs = w.segs[:len(w.segs)-1]
	return key, found, err
}

// errTooDeep ends a walk at maxDupDepth.
var errTooDeep = errors.New("nested too deep")

// duplicateKeyWords says which key was given twice, and where:
// `services.db: duplicate key "image" (each key once)`.
func duplicateKeyWords(path, key string) string {
	s := fmt.Sprintf("duplicate key %q (give each field once)", key)
	if path != "" {
		s = path + ": " + s
	}
	return s
}

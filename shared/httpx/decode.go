package httpx

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// MaxBody is the default cap on a request body. Control-plane bodies are
// small; anything larger is a mistake or an attack.
const MaxBody = 64 << 10

// DecodeOptions tune Decode.
type DecodeOptions struct {
	// Strict refuses members the destination type does not declare, at
	// every level (the spec's "exactly these members"). A route declares
	// its member set by its body struct: every field with a json tag is a
	// member, and adding an optional field (`json:"proof,omitempty"`)
	// admits that member and nothing else.
	Strict bool
	// MaxBytes overrides MaxBody.
	MaxBytes int64
	// AllowEmpty accepts an empty body as {} (for routes whose body is optional).
	AllowEmpty bool
}

// Decode reads a JSON body into dst with the spec's hygiene (spec §4: "All
// HTTP bodies are JSON with content-type: application/json"):
//
//   - the content type is application/json (a charset, if named, is
//     utf-8), else 415 CONTENT_TYPE_NOT_SUPPORTED;
//   - at most MaxBytes bytes (413 PAYLOAD_TOO_LARGE), read within the
//     request's body deadline (BodyDeadline);
//   - exactly one JSON object, parsed as protocol.ParseJSON parses signed
//     bytes: valid UTF-8, no duplicate member, bounded nesting;
//   - member names are exact: encoding/json would read "Email" or "EMAIL"
//     into an `email` field, so a member that differs from a declared one
//     only in case is refused, never read;
//   - in strict mode, no member the destination does not declare.
//
// Every refusal is an error a caller can act on (400 INVALID_REQUEST unless
// said otherwise).
func Decode(w http.ResponseWriter, r *http.Request, dst any, opt DecodeOptions) error {
	limit := opt.MaxBytes
	if limit <= 0 {
		limit = MaxBody
	}
	if r.Body == nil {
		if opt.AllowEmpty {
			return nil
		}
		return errs.New(errs.InvalidRequest, "request body is required (JSON)")
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, limit), min(r.ContentLength, limit))
	if err != nil {
		return readError(err, limit)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if opt.AllowEmpty {
			return nil
		}
		return errs.New(errs.InvalidRequest, "request body is required (JSON)")
	}
	if err := checkContentType(r.Header.Get("Content-Type")); err != nil {
		return err
	}
	return DecodeBytes(body, dst, opt.Strict)
}

// DecodeBytes is Decode's JSON step on its own: body must be one JSON
// object whose member names match dst's exactly (and, when strict, only
// the members dst declares).
func DecodeBytes(body []byte, dst any, strict bool) error {
	v, err := protocol.ParseJSON(body)
	if err != nil {
		return errs.Wrap(errs.InvalidRequest, "request body is not valid JSON: "+strings.TrimPrefix(err.Error(), protocol.ErrJSON.Error()+": "), err)
	}
	if _, ok := v.(map[string]any); !ok {
		return errs.New(errs.InvalidRequest, "request body must be a JSON object")
	}
	if err := checkBody(reflect.TypeOf(dst), v, strict); err != nil {
		return err
	}
	if err := json.Unmarshal(body, dst); err != nil {
		return errs.Wrap(errs.InvalidRequest, describeJSONError(err), err)
	}
	return nil
}

// readAll is io.ReadAll into a buffer sized for the body's announced
// length (at most the limit), so that a body of known size is read without
// growing and copying it on the way; a wrong announcement only costs the
// growth io.ReadAll would have made.
func readAll(r io.Reader, sizeHint int64) ([]byte, error) {
	b := make([]byte, 0, max(sizeHint, 0)+512)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// readError names why a body could not be read: too large, too slow (the
// body deadline passed), or cut off.
func readError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errs.Newf(errs.PayloadTooLarge, "request body is larger than %d bytes", limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errs.New(errs.InvalidRequest, "request body did not arrive in time; send it at once").WithStatus(http.StatusRequestTimeout)
	}
	return errs.Wrap(errs.InvalidRequest, "request body could not be read", err)
}

// checkContentType accepts application/json, with no charset or utf-8.
func checkContentType(ct string) error {
	if ct == "application/json" { // what nearly every client sends, as ParseMediaType reads it
		return nil
	}
	bad := func() error {
		if ct == "" {
			return errs.New(errs.ContentTypeNotSupported, "content-type must be application/json (none was sent)")
		}
		return errs.Newf(errs.ContentTypeNotSupported, "content-type must be application/json, not %.80q", ct)
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return bad()
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return bad()
		}
	}
	return nil
}

var (
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checkBody is checkMembers from the top of the body. It walks the body
// first without building member paths, so an accepted body costs no path
// strings, and walks it again with them for a refusal. Whether a body is
// refused does not depend on the order of the walk, so the second walk
// refuses it too (like the first, naming one offending member).
func checkBody(t reflect.Type, v any, strict bool) error {
	if checkMembers(t, v, "", strict, false) == nil {
		return nil
	}
	return checkMembers(t, v, "", strict, true)
}

// checkMembers walks the parsed value v beside the Go type t it will be
// decoded into, refusing member names that match a declared one only in
// case and, when strict, undeclared members. Values decoded by their own
// UnmarshalJSON, json.RawMessage and interface values are not walked: they
// carry no declared member set. Without paths, path stays "" and the
// refusal names members without it.
func checkMembers(t reflect.Type, v any, path string, strict, paths bool) error {
	for {
		if t.Implements(unmarshalerType) || t.Implements(textType) ||
			(t.Kind() != reflect.Pointer && (reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(textType))) {
			return nil // json.RawMessage included
		}
		if t.Kind() != reflect.Pointer {
			break
		}
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // a type mismatch; json.Unmarshal names it
		}
		fields := jsonFields(t)
		for name, mv := range obj {
			ft, ok := fields[name]
			if !ok {
				if decl := foldMatch(fields, name); decl != "" {
					return errs.Newf(errs.InvalidRequest, "member %q is not %q: member names are case-sensitive", path+name, path+decl)
				}
				if strict {
					return errs.Newf(errs.InvalidRequest, "unknown member %q (this route accepts exactly its documented members)", path+name)
				}
				continue
			}
			sub := path
			if paths {
				sub = path + name + "."
			}
			if err := checkMembers(ft, mv, sub, strict, paths); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, ev := range arr {
			sub := path
			if paths {
				sub = fmt.Sprintf("%s[%d].", strings.TrimSuffix(path, "."), i)
			}
			if err := checkMembers(t.Elem(), ev, sub, strict, paths); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for k, mv := range obj {
			sub := path
			if paths {
				sub = path + k + "."
			}
			if err := checkMembers(t.Elem(), mv, sub, strict, paths); err != nil {
				return err
			}
		}
	}
	return nil
}

// fieldsOf caches jsonFields by type: a type's fields never change, and
// the maps are only read.
var fieldsOf sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields maps the member names encoding/json reads into t to the
// fields' types, with embedded structs' fields promoted as encoding/json
// promotes them (outer names win).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldsOf.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f := structFields(t)
	fieldsOf.Store(t, f)
	return f
}

func structFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	var embedded []reflect.Type
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				embedded = append(embedded, et)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	for _, et := range embedded {
		for name, ft := range structFields(et) {
			if _, taken := out[name]; !taken {
				out[name] = ft
			}
		}
	}
	return out
}

// foldMatch returns the declared member that name equals under the case
// folding encoding/json applies (bytes.EqualFold), or "".
func foldMatch(fields map[string]reflect.Type, name string) string {
	for decl := range fields {
		if strings.EqualFold(decl, name) {
			return decl
		}
	}
	return ""
}

// describeJSONError turns decoder errors into sentences without echoing
// request content beyond a member name.
func describeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("request body is not valid JSON (at byte %d)", se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("member %q must be %s", te.Field, jsonKind(te.Type.Kind().String()))
		}
		return "request body must be a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "request body is truncated JSON"
	}
	return "request body is not valid JSON"
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return "a number"
}

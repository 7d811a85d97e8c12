package terraform

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"
)

// module is the root module as these tests see it: every declaration, every
// resource's body as plain values, and every reference with where it is.
//
// A body's values are what Terraform's JSON syntax would hold: strings
// (templates keep their "${...}" text, references become "${ref}"),
// numbers, booleans, lists, and maps; a nested block is a list of maps
// under its type (JSON files may give one block as a bare map: use
// blocks()).
type module struct {
	decls     map[string]string                    // "var.x", "local.x", "type.name", "data.type.name", "module.x" → file
	resources map[string]map[string]map[string]any // type → name → body
	files     map[string]string                    // resource "type.name" → file
	refs      []reference
}

type reference struct {
	file, ref string
}

// loadModule parses every *.tf file with hclsyntax and every *.tf.json file
// with hcl's JSON parser (and reads its values as Terraform's JSON syntax
// defines them).
func loadModule(t *testing.T) *module {
	t.Helper()
	m := &module{decls: map[string]string{}, resources: map[string]map[string]map[string]any{}, files: map[string]string{}}
	tfFiles, _ := filepath.Glob("*.tf")
	jsonFiles, _ := filepath.Glob("*.tf.json")
	if len(tfFiles) == 0 || len(jsonFiles) == 0 {
		t.Fatalf("found %d .tf and %d .tf.json files; run the tests from terraform/", len(tfFiles), len(jsonFiles))
	}
	for _, name := range tfFiles {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, diags := hclsyntax.ParseConfig(src, name, hcl.InitialPos)
		if diags.HasErrors() {
			t.Fatalf("%s: %s", name, diags.Error())
		}
		m.addHCL(t, name, src, f.Body.(*hclsyntax.Body))
	}
	for _, name := range jsonFiles {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		// hcl's own JSON parser must accept it, with the top-level blocks
		// Terraform reads.
		f, diags := hcljson.Parse(src, name)
		if diags.HasErrors() {
			t.Fatalf("%s: %s", name, diags.Error())
		}
		if _, _, diags := f.Body.PartialContent(topLevelSchema); diags.HasErrors() {
			t.Fatalf("%s: %s", name, diags.Error())
		}
		m.addJSON(t, name, src)
	}
	return m
}

var topLevelSchema = &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
	{Type: "resource", LabelNames: []string{"type", "name"}},
	{Type: "data", LabelNames: []string{"type", "name"}},
	{Type: "variable", LabelNames: []string{"name"}},
	{Type: "output", LabelNames: []string{"name"}},
	{Type: "module", LabelNames: []string{"name"}},
	{Type: "locals"},
	{Type: "terraform"},
	{Type: "provider", LabelNames: []string{"name"}},
}}

func (m *module) declare(t *testing.T, file, name string) {
	t.Helper()
	if prev, ok := m.decls[name]; ok {
		t.Errorf("%s: %s is declared again (first in %s)", file, name, prev)
	}
	m.decls[name] = file
}

func (m *module) addResource(t *testing.T, file, typ, name string, body map[string]any) {
	m.declare(t, file, typ+"."+name)
	if m.resources[typ] == nil {
		m.resources[typ] = map[string]map[string]any{}
	}
	m.resources[typ][name] = body
	m.files[typ+"."+name] = file
}

// --- native syntax ---

func (m *module) addHCL(t *testing.T, file string, src []byte, body *hclsyntax.Body) {
	t.Helper()
	for _, b := range body.Blocks {
		switch b.Type {
		case "variable":
			m.declare(t, file, "var."+b.Labels[0])
		case "locals":
			for name := range b.Body.Attributes {
				m.declare(t, file, "local."+name)
			}
		case "resource":
			m.addResource(t, file, b.Labels[0], b.Labels[1], hclBody(src, b.Body))
		case "data":
			m.declare(t, file, "data."+b.Labels[0]+"."+b.Labels[1])
		case "module":
			m.declare(t, file, "module."+b.Labels[0])
		}
		if b.Type == "variable" {
			// type = map(string) is a type constraint, not references.
			body := *b.Body
			body.Attributes = maps.Clone(b.Body.Attributes)
			delete(body.Attributes, "type")
			m.hclRefs(file, &body, nil)
			continue
		}
		m.hclRefs(file, b.Body, nil)
	}
}

// hclRefs records every reference in body; iterators are the names a
// dynamic block's content may use as well.
func (m *module) hclRefs(file string, body *hclsyntax.Body, iterators []string) {
	for name, a := range body.Attributes {
		if name == "ignore_changes" { // attribute names, not references
			continue
		}
		for _, tr := range hclsyntax.Variables(a.Expr) {
			if !slices.Contains(iterators, tr.RootName()) {
				m.refs = append(m.refs, reference{file, traversalString(tr)})
			}
		}
	}
	for _, b := range body.Blocks {
		inner := iterators
		if b.Type == "dynamic" {
			inner = append(slices.Clone(iterators), b.Labels[0])
			if it, ok := b.Body.Attributes["iterator"]; ok {
				inner = append(inner, hcl.ExprAsKeyword(it.Expr))
			}
		}
		m.hclRefs(file, b.Body, inner)
	}
}

func hclBody(src []byte, body *hclsyntax.Body) map[string]any {
	out := map[string]any{}
	for name, a := range body.Attributes {
		out[name] = hclValue(src, a.Expr)
	}
	for _, b := range body.Blocks {
		v := hclBody(src, b.Body)
		if len(b.Labels) > 0 {
			v["__labels"] = b.Labels
		}
		list, _ := out[b.Type].([]any)
		out[b.Type] = append(list, v)
	}
	return out
}

func hclValue(src []byte, e hclsyntax.Expression) any {
	text := func(r hcl.Range) string { return string(r.SliceBytes(src)) }
	switch e := e.(type) {
	case *hclsyntax.LiteralValueExpr:
		return ctyValue(e.Val)
	case *hclsyntax.TemplateExpr:
		if len(e.Parts) == 1 {
			if lit, ok := e.Parts[0].(*hclsyntax.LiteralValueExpr); ok {
				return ctyValue(lit.Val)
			}
		}
		return strings.Trim(text(e.SrcRange), `"`)
	case *hclsyntax.TupleConsExpr:
		out := []any{}
		for _, x := range e.Exprs {
			out = append(out, hclValue(src, x))
		}
		return out
	case *hclsyntax.ObjectConsExpr:
		out := map[string]any{}
		for _, item := range e.Items {
			key := hcl.ExprAsKeyword(item.KeyExpr)
			if key == "" {
				key = fmt.Sprint(hclValue(src, item.KeyExpr.(*hclsyntax.ObjectConsKeyExpr).Wrapped))
			}
			out[key] = hclValue(src, item.ValueExpr)
		}
		return out
	}
	return "${" + text(e.Range()) + "}"
}

func ctyValue(v cty.Value) any {
	switch {
	case v.IsNull():
		return nil
	case v.Type() == cty.String:
		return v.AsString()
	case v.Type() == cty.Bool:
		return v.True()
	case v.Type() == cty.Number:
		f, _ := v.AsBigFloat().Float64()
		return f
	}
	return v.GoString()
}

// --- JSON syntax ---

func (m *module) addJSON(t *testing.T, file string, src []byte) {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(src, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for key, v := range doc {
		switch key {
		case "//":
			continue
		case "resource":
			for typ, byName := range v.(map[string]any) {
				for name, body := range byName.(map[string]any) {
					m.addResource(t, file, typ, name, body.(map[string]any))
				}
			}
		case "locals":
			for name := range v.(map[string]any) {
				m.declare(t, file, "local."+name)
			}
		case "variable":
			for name := range v.(map[string]any) {
				m.declare(t, file, "var."+name)
			}
		case "data":
			for typ, byName := range v.(map[string]any) {
				for name := range byName.(map[string]any) {
					m.declare(t, file, "data."+typ+"."+name)
				}
			}
		case "output", "module", "terraform", "provider":
		default:
			t.Errorf("%s: unexpected top-level member %q", file, key)
		}
		m.jsonRefs(t, file, key, v, nil)
	}
}

// jsonRefs records the references in a JSON value as Terraform reads it:
// every string is a template, depends_on holds bare references, and a
// "dynamic" member's content may use the block's name as its iterator.
func (m *module) jsonRefs(t *testing.T, file, key string, v any, iterators []string) {
	t.Helper()
	switch v := v.(type) {
	case string:
		if key == "//" {
			return
		}
		if key == "depends_on#" {
			tr, diags := hclsyntax.ParseTraversalAbs([]byte(v), file, hcl.InitialPos)
			if diags.HasErrors() {
				t.Errorf("%s: depends_on %q: %s", file, v, diags.Error())
				return
			}
			m.refs = append(m.refs, reference{file, traversalString(tr)})
			return
		}
		expr, diags := hclsyntax.ParseTemplate([]byte(v), file, hcl.InitialPos)
		if diags.HasErrors() {
			t.Errorf("%s: %q: %s", file, v, diags.Error())
			return
		}
		for _, tr := range hclsyntax.Variables(expr) {
			if !slices.Contains(iterators, tr.RootName()) {
				m.refs = append(m.refs, reference{file, traversalString(tr)})
			}
		}
	case []any:
		inner := key
		if key == "depends_on" {
			inner = "depends_on#"
		}
		for _, x := range v {
			m.jsonRefs(t, file, inner, x, iterators)
		}
	case map[string]any:
		for k, x := range v {
			if k == "dynamic" {
				for label, d := range x.(map[string]any) {
					m.jsonRefs(t, file, label, d, append(slices.Clone(iterators), label))
				}
				continue
			}
			if k == "ignore_changes" {
				continue
			}
			m.jsonRefs(t, file, k, x, iterators)
		}
	}
}

func traversalString(tr hcl.Traversal) string {
	var b strings.Builder
	for _, s := range tr {
		switch s := s.(type) {
		case hcl.TraverseRoot:
			b.WriteString(s.Name)
		case hcl.TraverseAttr:
			b.WriteString("." + s.Name)
		case hcl.TraverseIndex:
			if s.Key.Type() == cty.String {
				b.WriteString(`["` + s.Key.AsString() + `"]`)
			} else {
				b.WriteString(fmt.Sprintf("[%v]", ctyValue(s.Key)))
			}
		case hcl.TraverseSplat:
			b.WriteString("[*]")
		}
	}
	return b.String()
}

// resolves says whether ref names something declared in the module.
func (m *module) resolves(ref string) bool {
	parts := strings.FieldsFunc(ref, func(r rune) bool { return r == '.' || r == '[' })
	switch root := parts[0]; root {
	case "each", "count", "self", "path", "terraform":
		return true
	case "var", "local", "module":
		return len(parts) > 1 && m.decls[root+"."+parts[1]] != ""
	case "data":
		return len(parts) > 2 && m.decls["data."+parts[1]+"."+parts[2]] != ""
	default:
		return len(parts) > 1 && m.decls[root+"."+parts[1]] != ""
	}
}

// --- reading bodies ---

// get walks a body by keys; a nested block (a list of maps, or one map)
// yields its first block.
func get(v any, keys ...string) any {
	for _, k := range keys {
		switch x := v.(type) {
		case []any:
			if len(x) == 0 {
				return nil
			}
			v = x[0]
		}
		mv, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mv[k]
	}
	if x, ok := v.([]any); ok && len(x) == 1 {
		if _, isMap := x[0].(map[string]any); isMap {
			return x[0]
		}
	}
	return v
}

func str(v any, keys ...string) string {
	s, _ := get(v, keys...).(string)
	return s
}

// blocks is a nested block type's blocks, whether given as a list or as
// one map.
func blocks(v any, key string) []map[string]any {
	mv, _ := v.(map[string]any)
	switch x := mv[key].(type) {
	case map[string]any:
		return []map[string]any{x}
	case []any:
		var out []map[string]any
		for _, b := range x {
			if bm, ok := b.(map[string]any); ok {
				out = append(out, bm)
			}
		}
		return out
	}
	return nil
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

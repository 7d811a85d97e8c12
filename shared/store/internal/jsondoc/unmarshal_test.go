package jsondoc

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// Document types of the shapes the control plane stores.
type (
	udAgent struct {
		ID        string `json:"id"`
		AccountID string `json:"account_id"`
		Label     string `json:"label"`
		Handle    string `json:"handle,omitempty"`
		CreatedAt int64  `json:"created_at"`
		Enabled   bool   `json:"enabled"`
	}
	udOwner struct {
		AccountID string `json:"account_id"`
	}
	udHosts struct {
		AgentID string   `json:"agent_id"`
		Keys    []string `json:"keys"`
		owner   string
	}
	udSmall struct {
		N8    int8   `json:"n8"`
		N16   int16  `json:"n16"`
		N32   int32  `json:"n32"`
		N     int    `json:"n"`
		Plain string // named by its Go name
		Skip  string `json:"-"`
	}
	udDash struct {
		Dash string `json:"-,"` // named "-"
	}
	udList  []string
	udNamed struct {
		L udList `json:"l"`
	}
	// Not plain: a float, a pointer, a map, an option, an embedded field,
	// (udDash) a name that is not letters, digits and underscores.
	udFloat struct {
		F float64 `json:"f"`
	}
	udPtr struct {
		P *int64 `json:"p"`
	}
	udMap struct {
		M map[string]string `json:"m"`
	}
	udQuoted struct {
		N int64 `json:"n,string"`
	}
	udEmbed struct {
		udAgent
		X string `json:"x"`
	}
)

func udTypes() []any {
	return []any{&udAgent{}, &udOwner{}, &udHosts{}, &udSmall{}, &udNamed{}, &udFloat{}, &udPtr{}, &udMap{}, &udQuoted{}, &udEmbed{}, &udDash{}}
}

// sameAsJSON fails t unless Unmarshal and json.Unmarshal leave fresh
// values of every document type equal, with errors alike.
func sameAsJSON(t *testing.T, raw []byte) {
	t.Helper()
	for _, proto := range udTypes() {
		typ := reflect.TypeOf(proto).Elem()
		got, want := reflect.New(typ), reflect.New(typ)
		gotErr, wantErr := Unmarshal(raw, got.Interface()), json.Unmarshal(raw, want.Interface())
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("%T from %q: error %v, json.Unmarshal %v", proto, raw, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got.Interface(), want.Interface()) {
			t.Fatalf("%T from %q: %+v, json.Unmarshal %+v", proto, raw, got.Elem(), want.Elem())
		}
	}
}

var udSeeds = []string{
	`{"id":"UA","account_id":"0190","label":"agent3","created_at":1764000000000,"enabled":true}`,
	`{"id":"UA","account_id":"0190","label":"a","handle":"h","created_at":-5,"enabled":false}`,
	`{"agent_id":"UA","keys":["UB","UC"]}`,
	`{"agent_id":"UA","keys":[]}`,
	`{"agent_id":"UA","keys":null}`,
	`{"agent_id":"UA","keys":["U\u0042"]}`,
	`{"agent_id":"é","keys":["a"]}`,
	`{"n8":127,"n16":-32768,"n32":2147483647,"n":9007199254740993,"Plain":"p","-":"d","Skip":"s"}`,
	`{"n8":128}`,
	`{"n":1.0}`,
	`{"n":1e3}`,
	`{"n":01}`,
	`{"n":-0}`,
	`{"n":123456789012345678901}`,
	`{"l":["x"]}`,
	`{"f":1.5}`,
	`{"p":1}`,
	`{"m":{"a":"b"}}`,
	`{"n":"12"}`,
	`{"x":"y","id":"z"}`,
	`{"ID":"case"}`,
	`{"id":"a","id":"b"}`,
	`{"id":1}`,
	`{"enabled":"true"}`,
	`{ "id" : "spaced" }`,
	`{}`,
	`{}x`,
	`[]`,
	`null`,
	``,
	`{"id":"a",}`,
	`{"id":"a"`,
	`{"id":"tab	in"}`,
	`{"keys":["a",1]}`,
	`{"ACCOUNT_ID":"x","account_id":"y"}`,
	`{"account_id":"y","Account_Id":"x"}`,
	`{"other":1.5e-3,"more":[1],"x":{"a":1},"account_id":"y"}`,
	`{"other":-0.0,"n2":true,"n3":null,"s":"\u00e9","account_id":"y"}`,
	`{"other":1.,"account_id":"y"}`,
	`{"other":1e,"account_id":"y"}`,
	`{"other":-,"account_id":"y"}`,
	`{"other":tru,"account_id":"y"}`,
	`{"other":nulll,"account_id":"y"}`,
	`{"other":1E+2,"account_id":"y"}`,
	`{"other":0123,"account_id":"y"}`,
}

func TestUnmarshalIsJSONUnmarshal(t *testing.T) {
	for _, s := range udSeeds {
		sameAsJSON(t, []byte(s))
	}
	// The plain types take the fast path on what this package's encoder
	// writes, and the others never do.
	for _, c := range []struct {
		doc   any
		plain bool
	}{{&udAgent{}, true}, {&udOwner{}, true}, {&udHosts{}, true}, {&udSmall{}, true}, {&udNamed{}, true},
		{&udFloat{}, false}, {&udPtr{}, false}, {&udMap{}, false}, {&udQuoted{}, false}, {&udEmbed{}, false}, {&udDash{}, false}} {
		if got := planOf(reflect.TypeOf(c.doc).Elem()) != nil; got != c.plain {
			t.Errorf("%T plain = %v, want %v", c.doc, got, c.plain)
		}
	}
	a := udAgent{ID: "UA", AccountID: "acc", Label: "l", CreatedAt: 17, Enabled: true}
	raw, err := EncodeRaw(a)
	if err != nil {
		t.Fatal(err)
	}
	var back udAgent
	if !planOf(reflect.TypeFor[udAgent]()).decode(raw, reflect.ValueOf(&back).Elem()) || back != a {
		t.Fatalf("the encoder's own document %s did not take the fast path: %+v", raw, back)
	}
	// A narrower type skips the members it has no field for.
	var owner udOwner
	if !planOf(reflect.TypeFor[udOwner]()).decode(raw, reflect.ValueOf(&owner).Elem()) || owner.AccountID != "acc" {
		t.Fatalf("%s into a narrower type did not take the fast path: %+v", raw, owner)
	}
}

func FuzzUnmarshalIsJSONUnmarshal(f *testing.F) {
	for _, s := range udSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"agent_id":"` + strings.Repeat("U", 56) + `","keys":["` + strings.Repeat("A", 56) + `"]}`))
	f.Fuzz(func(t *testing.T, raw []byte) { sameAsJSON(t, raw) })
}

// BenchmarkUnmarshal is a stored agent record and host record, decoded by
// Unmarshal and by encoding/json.
func BenchmarkUnmarshal(b *testing.B) {
	agent := []byte(`{"id":"UABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRSTUVW","account_id":"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b","label":"agent3","created_at":1764000000000,"enabled":true}`)
	hosts := []byte(`{"agent_id":"UABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRSTUVW","keys":["UBBCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRSTUVW"]}`)
	for _, c := range []struct {
		name string
		fn   func([]byte, any) error
	}{{"jsondoc", Unmarshal}, {"encoding-json", json.Unmarshal}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var a udAgent
				var h udHosts
				if c.fn(agent, &a) != nil || c.fn(hosts, &h) != nil {
					b.Fatal("decode")
				}
			}
		})
	}
}

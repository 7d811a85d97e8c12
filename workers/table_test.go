package workers

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"agentmesh.dev/mesh/shared/bus/bustest"
)

// fieldOf is the Config field of a row: its name, capitalised.
func fieldOf(name string) string { return strings.ToUpper(name[:1]) + name[1:] }

// Every row is complete, runs in the cloud with ProductionReplicas, and its
// production configuration sets only Replicas and its own field; every
// worker of Config has its row.
func TestTableRows(t *testing.T) {
	seen := map[string]bool{}
	cfgType := reflect.TypeFor[Config]()
	for _, w := range Table() {
		if w.Name == "" || seen[w.Name] {
			t.Fatalf("row %q: empty or duplicate name", w.Name)
		}
		seen[w.Name] = true
		if w.Description == "" || strings.Contains(w.Description, "\n") {
			t.Errorf("%s: description %q is not one line", w.Name, w.Description)
		}
		if w.Start == nil {
			t.Errorf("%s: no start function", w.Name)
		}
		if w.MinInstances < 1 || w.MaxInstances < w.MinInstances || w.CPU == "" || w.Memory == "" {
			t.Errorf("%s: Cloud Run sizing %d..%d, cpu %q, memory %q", w.Name, w.MinInstances, w.MaxInstances, w.CPU, w.Memory)
		}
		if w.Production.Replicas != ProductionReplicas {
			t.Errorf("%s: production replicas %d", w.Name, w.Production.Replicas)
		}
		own := fieldOf(w.Name)
		if _, ok := cfgType.FieldByName(own); !ok {
			t.Errorf("%s: Config has no field %s", w.Name, own)
		}
		v := reflect.ValueOf(w.Production)
		for i := range cfgType.NumField() {
			f := cfgType.Field(i)
			if f.Name != "Replicas" && f.Name != own && !v.Field(i).IsZero() {
				t.Errorf("%s: production configuration sets %s", w.Name, f.Name)
			}
		}
		if got, err := Lookup(w.Name); err != nil || got.Name != w.Name {
			t.Errorf("Lookup(%q) = %q, %v", w.Name, got.Name, err)
		}
	}
	for i := range cfgType.NumField() {
		if f := cfgType.Field(i); f.Name != "Replicas" && !seen[strings.ToLower(f.Name)] {
			t.Errorf("Config.%s has no row", f.Name)
		}
	}
	if _, err := Lookup("nope"); err == nil || !strings.Contains(err.Error(), "registry") {
		t.Errorf("Lookup of an unknown worker: %v", err)
	}
	act, _ := Lookup("activity")
	if len(act.Production.Activity.Official) != 0 {
		t.Errorf("the catalog has official agents by default: %q", act.Production.Activity.Official)
	}
}

// Every row takes its replicas from the configuration: a single server
// refuses the production count (3) for the row's streams and buckets, and
// starts the same configuration with replicas set to 1 (as devenv runs
// it), whose micro service then answers $SRV.PING.
func TestEveryRowStarts(t *testing.T) {
	b := bustest.Start(t)
	client := bustest.Client(t, b)
	for _, w := range Table() {
		if s, err := w.Start(t.Context(), bustest.Env(t, b, "worker-"+w.Name+"-r3", nil), w.Production); err == nil {
			_ = s.Stop()
			t.Fatalf("%s: started with %d replicas on a single server", w.Name, w.Production.Replicas)
		} else if !strings.Contains(err.Error(), "replicas") {
			t.Fatalf("%s: refused for another reason than its replicas: %v", w.Name, err)
		}
		cfg := w.Production
		cfg.Replicas = 1
		s, err := w.Start(t.Context(), bustest.Env(t, b, "worker-"+w.Name, nil), cfg)
		if err != nil {
			t.Fatalf("%s: %v", w.Name, err)
		}
		t.Cleanup(func() { _ = s.Stop() })
		msg, err := client.RequestWithContext(t.Context(), "$SRV.PING.mesh-"+w.Name, nil)
		if err != nil {
			t.Fatalf("%s: ping: %v", w.Name, err)
		}
		var ping micro.Ping
		if err := json.Unmarshal(msg.Data, &ping); err != nil || ping.Name != "mesh-"+w.Name {
			t.Fatalf("%s: ping answer %s (%v)", w.Name, msg.Data, err)
		}
	}
}

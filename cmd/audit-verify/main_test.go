package main

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/audit/audittest"
)

func TestAuditVerify(t *testing.T) {
	f := audittest.NewFixture(t)
	dir := t.TempDir()
	write := func(name string, v any) string {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", f.Bundle)
	f.Bundle.Chains[0].Rows[1].Outcome = "failed"
	changed := write("changed.json", f.Bundle)
	var roots []byte
	for _, a := range f.Authorities {
		roots = append(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Root().Raw})...)
	}
	rootsFile := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(rootsFile, roots, 0o644); err != nil {
		t.Fatal(err)
	}
	otherRoot := filepath.Join(dir, "other.pem")
	if err := os.WriteFile(otherRoot, audittest.NewAuthority(t, "other").RootPEM(), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"pinned", []string{"-key", f.Signer.Public(), "-roots", rootsFile, good}, 0, "verified: 3 chains, 11 rows (10 under a timestamped anchor), 2 anchors from 2026-03-01 to 2026-03-02 with 4 timestamps, 4 inclusion proofs\n", ""},
		{"pinned, each anchor's first stamp", []string{"-key", f.Signer.Public(), "-roots", rootsFile, good}, 0, "\nanchor 2026-03-01: first stamped 20", ""},
		{"unpinned", []string{good}, 3, "self-consistent only (no -key/-roots pinned): 3 chains, 11 rows", ""},
		{"unpinned, notes", []string{good}, 3, "note: the export key", ""},
		{"key pinned, roots not", []string{"-key", f.Signer.Public(), good}, 3, "self-consistent only (no -key/-roots pinned)", ""},
		{"changed row", []string{changed}, 1, "", "audit-verify: FAILED: chain link: chain " + f.Agents[0] + ": row 3 does not link to row 2"},
		{"other key", []string{"-key", audittest.Agent(t), good}, 1, "", "not by the expected export key"},
		{"other roots", []string{"-roots", otherRoot, good}, 1, "", "its root is not among the trusted roots"},
		{"no file", []string{filepath.Join(dir, "none.json")}, 2, "", "no such file"},
		{"no argument", nil, 2, "", "usage: audit-verify"},
		{"not a bundle", []string{rootsFile}, 1, "", "the file is not an export bundle"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(c.args, &stdout, &stderr)
			if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.stderr) {
				t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
			}
		})
	}
}

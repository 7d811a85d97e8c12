package workers

import (
	"io"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/board"
)

// board-worker runs the board's default limits, which its MESH_LIMIT_BOARD_*
// variables and --limit-board-* flags change.
func TestBoardKnobs(t *testing.T) {
	w, err := Lookup(board.Name)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MESH_CREDS_FILE": "c", "MESH_SERVICES_KEY_FILE": "k", "MESH_LIMIT_BOARD_LEASE_MAX": "2h"}
	_, cfg, err := parse(w, nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := board.DefaultLimits
	want.LeaseMax = 2 * time.Hour
	if cfg.Board.Limits != want || cfg.Replicas != ProductionReplicas {
		t.Fatalf("config %+v", cfg.Board)
	}
	_, cfg, err = parse(w, []string{"--limit-board-open-items", "50", "--limit-board-lease-max", "3h"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Board.Limits.OpenItems != 50 || cfg.Board.Limits.LeaseMax != 3*time.Hour {
		t.Fatalf("flags did not win: %+v", cfg.Board)
	}
	for _, bad := range [][]string{{"--limit-board-lease-max", "30s"}, {"--limit-board-items", "0"}} {
		if _, _, err := parse(w, bad, func(k string) string { return env[k] }, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

package rooms

import "testing"

// A room id is typed as a command's argument: it must never read as a flag.
func TestNewRoomIDNeverLooksLikeAFlag(t *testing.T) {
	for range 2000 {
		id, err := NewRoomID()
		if err != nil {
			t.Fatal(err)
		}
		if id[0] == '-' || len(id) != 24 {
			t.Fatalf("room id %q", id)
		}
	}
}

package rooms

import (
	"encoding/json"
	"fmt"

	"agentmesh.dev/mesh/shared/errs"
)

// DriveEntryOverhead is what every drive entry, a file or a link, counts in
// the room's drive bytes and its operator's quota besides its file's bytes:
// its index key is stored and listed whatever the file's size (a link holds
// no bytes at all), so a drive of empty files or links is not free.
const DriveEntryOverhead = 1 << 10

// Pages of the listings that grow with a room (status's drive entries,
// notes) and with an agent (mine): a page holds at most its verb's limit of
// items and stops before pageBytes of them, and names the key of its last
// item in next when more follow; the next page starts after it.
const (
	// MaxDrivePage is the most drive entries (and notes) one page lists,
	// and the default.
	MaxDrivePage = 200
	// DefaultMinePage and MaxMinePage bound mine's pages.
	DefaultMinePage = 100
	MaxMinePage     = 500
	// maxAfter bounds a page cursor as given back.
	maxAfter = 512
)

// pageBytes bounds the items of one page (JSON bytes), well inside the
// transport's 1 MiB; a test lowers it.
var pageBytes = 512 << 10

// pageRequest reads a page's cursor and limit (nil: def; over max: max).
// name is the limit's member, for the message.
func pageRequest(after *string, limit *int, name string, def, max int) (string, int, error) {
	n := def
	if limit != nil {
		if *limit < 1 {
			return "", 0, errs.Newf(errs.InputInvalid, "%s must be 1 to %d", name, max)
		}
		n = min(*limit, max)
	}
	a := ""
	if after != nil {
		if len(*after) > maxAfter {
			return "", 0, errs.New(errs.InputInvalid, "the page cursor is not one this service gave: pass back next as it came")
		}
		a = *after
	}
	return a, n, nil
}

// pageOf is the page of items (sorted by key, ascending) after the key
// after: at most limit items and at most pageBytes of their JSON (always
// one, however long), and the key of its last item when more follow.
func pageOf[T any](items []T, key func(T) string, after string, limit int) ([]T, string, error) {
	out := []T{}
	size := 0
	for _, it := range items {
		if after != "" && key(it) <= after {
			continue
		}
		b, err := json.Marshal(it)
		if err != nil {
			return nil, "", fmt.Errorf("rooms: page: %w", err)
		}
		if len(out) == limit || (size+len(b)+1 > pageBytes && len(out) > 0) {
			return out, key(out[len(out)-1]), nil
		}
		size += len(b) + 1
		out = append(out, it)
	}
	return out, "", nil
}

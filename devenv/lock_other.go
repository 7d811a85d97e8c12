//go:build !unix

package devenv

import "os"

// tryLock has no flock to take here: the data directory is not locked,
// and only the control store's own lock keeps two meshd processes apart.
func tryLock(*os.File) (held bool, err error) { return false, nil }

package rooms

// SetPageBytes lowers the page budget for a test and returns what puts it
// back.
func SetPageBytes(n int) (restore func()) {
	old := pageBytes
	pageBytes = n
	return func() { pageBytes = old }
}

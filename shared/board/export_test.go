package board

// SetListPageBytes sets the list page budget for a test and returns what
// puts it back.
func SetListPageBytes(n int) (restore func()) {
	old := listPageBytes
	listPageBytes = n
	return func() { listPageBytes = old }
}

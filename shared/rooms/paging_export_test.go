package rooms

func setPageBytes(n int) (restore func()) {
	old := pageBytes
	pageBytes = n
	return func() { pageBytes = old }
}

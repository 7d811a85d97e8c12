package keys

// SetCompareHook makes f see every signature the Compare verifier checks,
// so a test can collect the (key, message, signature) triples some other
// code verifies. It returns a function that removes f.
func SetCompareHook(f func(pub, msg, sig []byte)) (remove func()) {
	compareHook.Store(&f)
	return func() { compareHook.Store(nil) }
}

// Tally records one Compare outcome, for testing the disagreement count
// (the two real implementations never disagree, so a test must fake it).
var Tally = tally

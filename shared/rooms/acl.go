package rooms

// aclEndpoints are the acl grade's verbs: admit, expel, leave, credential.
// (Owned by the acl work.)
func (w *Worker) aclEndpoints() []endpoint { return nil }

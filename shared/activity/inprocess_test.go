package activity

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// On a replicated timeline a record published by two copies at once is
// refused to the second with "duplicate message id is in process": that is
// a duplicate, not a failure.
func TestInProcess(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{Code: 409, ErrorCode: errCodeDuplicateInProcess, Description: "duplicate message id is in process"}, true},
		{fmt.Errorf("publish: %w", &jetstream.APIError{Code: 409, ErrorCode: errCodeDuplicateInProcess}), true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008}, false},
		{errors.New("nats: timeout"), false},
	} {
		if got := inProcess(tc.err); got != tc.want {
			t.Errorf("inProcess(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

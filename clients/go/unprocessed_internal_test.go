package idemd

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestUnprocessed: only grpc-go's statuses for a call the server never took
// are sent again by unprocessedRetryInterceptor; an error the server may have
// seen is not.
func TestUnprocessed(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "the connection is draining"), true},
		{status.Error(codes.Unavailable, "stream terminated by RST_STREAM with error code: REFUSED_STREAM"), true},
		{status.Error(codes.Unavailable, "error reading from server: EOF"), false},
		{status.Error(codes.Unavailable, "transport is closing"), false},
		{status.Error(codes.Unavailable, "stream terminated by RST_STREAM with error code: INTERNAL_ERROR"), false},
		{status.Error(codes.Internal, "the connection is draining"), false},
		{errors.New("the connection is draining"), false},
		{nil, false},
	} {
		if got := unprocessed(c.err); got != c.want {
			t.Errorf("unprocessed(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

package idemd_test

import (
	"testing"

	"github.com/idemd/idemd/clients/go/internal/testserver"
)

// TestMain stops the idemd that the live tests share.
func TestMain(m *testing.M) { testserver.Main(m) }

package testenv

import (
	"testing"
	"time"
)

// WaitTimeout is how long [WaitFor] polls before it fails the test: generous, because the tests
// run under -race on two cores beside a kube-apiserver.
const WaitTimeout = 30 * time.Second

// WaitFor polls cond every few milliseconds until it holds, and fails t if it does not within
// [WaitTimeout]. what names the awaited state in the failure message.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", WaitTimeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

// AuditEvent is what the tests read of an audit.k8s.io/v1 Event, one line of the JSON audit log
// of a [KubeAPIServer] started with AuditLog.
type AuditEvent struct {
	Verb string
	// RequestURI is the request's path and query, such as
	// /api/v1/services?sendInitialEvents=true&watch=true.
	RequestURI string `json:"requestURI"`
	User       struct{ Username string }
	// ObjectRef is nil for a request that is not for a resource, such as /version.
	ObjectRef *struct {
		Resource, APIGroup, Subresource, Namespace, Name string
	}
	ResponseStatus *struct{ Code int }
}

// AuditEvents returns the events of the JSON audit log at path, in the order logged.
func AuditEvents(path string) ([]AuditEvent, error) { return AuditEventsFrom(path, 0) }

// AuditEventsFrom returns the events of the JSON audit log at path logged from byte offset on
// (the log's size at some earlier moment, for the requests made since), in the order logged.
func AuditEventsFrom(path string, offset int64) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("testenv: audit log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return nil, fmt.Errorf("testenv: audit log %s: %w", path, err)
	}
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("testenv: audit log %s: %w", path, err)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("testenv: audit log %s: %w", path, err)
	}
	return out, nil
}

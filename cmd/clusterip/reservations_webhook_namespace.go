package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// serviceAccountNamespaceFile is where a Pod's service account namespace is mounted.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// handoutNamespace returns the namespace of the webhook's hand-out records: flag if set, else
// $POD_NAMESPACE, else the namespace of the Pod's service account (as controller-runtime finds
// its own), else an error naming --namespace.
func handoutNamespace(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns, nil
	}
	b, err := os.ReadFile(serviceAccountNamespaceFile)
	if errors.Is(err, os.ErrNotExist) {
		return "", errors.New("--namespace is required outside a Pod (no $POD_NAMESPACE, no " + serviceAccountNamespaceFile + ")")
	}
	if err != nil {
		return "", fmt.Errorf("--namespace: %w", err)
	}
	if ns := strings.TrimSpace(string(b)); ns != "" {
		return ns, nil
	}
	return "", fmt.Errorf("--namespace is required: %s is empty", serviceAccountNamespaceFile)
}

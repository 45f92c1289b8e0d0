//go:build !linux

package kubeapiserverfork_test

import (
	"errors"
	"time"
)

var errNoCPU = errors.New("CPU times are only read on Linux")

func selfCPU() (time.Duration, error) { return 0, errNoCPU }

func processCPU(string, string) (func() (time.Duration, error), error) { return nil, errNoCPU }

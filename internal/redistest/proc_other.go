//go:build !linux

package redistest

import (
	"errors"
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

const (
	sigStop syscall.Signal = 0
	sigCont syscall.Signal = 0
)

func signal(*os.Process, syscall.Signal) error {
	return errors.New("redistest: stalling a server needs Linux")
}

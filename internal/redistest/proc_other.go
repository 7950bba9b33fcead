//go:build !linux

package redistest

import (
	"errors"
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func freeze(p *os.Process) error { return errors.New("redistest: Freeze needs Linux") }

func thaw(p *os.Process) error { return errors.New("redistest: Thaw needs Linux") }

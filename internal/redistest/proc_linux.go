package redistest

import (
	"os"
	"syscall"
)

// sysProcAttr makes a started redis-server die with the test process, so a
// crashed test leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

func freeze(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func thaw(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

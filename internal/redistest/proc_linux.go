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

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

func signal(p *os.Process, sig syscall.Signal) error { return p.Signal(sig) }

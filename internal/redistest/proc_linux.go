package redistest

import "syscall"

// sysProcAttr makes a started redis-server die with the test process, so a
// crashed test leaves no server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

package qemuimg

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// bounds are what one run of qemu-img on an image from outside may take: a time
// limit, and, when util-linux's prlimit is installed, CPU time and memory.
type bounds struct {
	timeout time.Duration
	cpu     time.Duration // of CPU time, whole seconds
	// Memory is bounded as address space (RLIMIT_AS) or as private writable
	// memory (RLIMIT_DATA), in bytes; one of them. Each thread of qemu-img's pool
	// reserves address space it never uses (its stack, an allocator arena), so
	// address space fits a run that starts few threads alone.
	addressSpace, data int64
}

// infoBounds bound `qemu-img info`: its probe reads a few headers, in well under a
// second and a few MiB (a quarter of the address space given is plenty).
var infoBounds = bounds{timeout: 60 * time.Second, cpu: 30 * time.Second, addressSpace: 1 << 30}

// The bounds of a conversion grow with the disk, whose every byte it may read
// and write: ten minutes and a minute a GiB of time (a disk writing 17 MiB/s
// keeps within it), five minutes and 30 seconds a GiB of CPU (reading a
// zlib-compressed qcow2 takes about 9 seconds a GiB), and 2 GiB of memory (a
// conversion holds some 25 MiB, in up to 66 threads whose stacks count).
const (
	convertTime       = 10 * time.Minute
	convertTimePerGiB = time.Minute
	convertCPU        = 5 * time.Minute
	convertCPUPerGiB  = 30 * time.Second
	convertMemory     = 2 << 30
)

// convertBounds bound `qemu-img convert` of a disk of virtualSize bytes.
func convertBounds(virtualSize int64) bounds {
	gib := time.Duration((max(virtualSize, 0) + 1<<30 - 1) >> 30)
	return bounds{
		timeout: convertTime + gib*convertTimePerGiB,
		cpu:     convertCPU + gib*convertCPUPerGiB,
		data:    convertMemory,
	}
}

// command returns qemu-img (a program name or path) run with args within b, and
// the context it runs under, which ends at b's time limit or with ctx; the
// caller calls cancel once it has run. When prlimit is not installed, the time
// limit alone holds.
func (b bounds) command(ctx context.Context, qemuImg string, args ...string) (*exec.Cmd, context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	argv := append([]string{qemuImg}, args...)
	if prlimit, err := exec.LookPath("prlimit"); err == nil {
		// At the soft CPU limit the kernel sends SIGXCPU, which qemu-img dies of,
		// saying which bound it hit; SIGKILL at the hard one, should it not. A
		// crash leaves no core, which would hold the image's data.
		cpu := int64(b.cpu / time.Second)
		limits := []string{prlimit, fmt.Sprintf("--cpu=%d:%d", cpu, cpu+5), "--core=0"}
		if b.addressSpace > 0 {
			limits = append(limits, fmt.Sprintf("--as=%d", b.addressSpace))
		}
		if b.data > 0 {
			limits = append(limits, fmt.Sprintf("--data=%d", b.data))
		}
		argv = append(append(limits, "--"), argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	// Killed at the limit or on cancel; a child that kept the pipes open must not
	// hold us past it.
	cmd.WaitDelay = 5 * time.Second
	return cmd, ctx, cancel
}

// exceeded says which of b a run that failed with err under ctx (command's) ran
// out of, or "" when it ran out of none. parent is the caller's context: a run it
// cancelled ran out of nothing.
func (b bounds) exceeded(parent, ctx context.Context, err error) string {
	if parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Sprintf("ran longer than its %s", b.timeout)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGXCPU {
			return fmt.Sprintf("used its %s of CPU time", b.cpu)
		}
	}
	return ""
}

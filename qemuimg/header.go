package qemuimg

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// What qemu-img is not allowed to see is judged here, in Go, before it opens the file:
// `qemu-img info` opens a vmdk's extents to list them (an extent at a FIFO holds it for
// its whole time limit, and its error tells whether a path exists), and qemu before the
// fix of CVE-2024-4467 opens a qcow2's external data file. So the header must be the
// claimed format's, and name no other file, before qemu-img runs with -f that format.

const (
	// headLength is how much of a file is read to judge it: a qcow2's header extensions
	// lie within its first cluster, 2 MiB at most.
	headLength = 2 << 20
	// probeLength is how much of a file qemu's format probe reads.
	probeLength = 512
	// maxQuoted bounds the names quoted from a file in a message.
	maxQuoted = 200
)

// headerProblems lists why the file at path, claimed to be in format (canonical), must not
// reach qemu-img: a header that is not the claimed format's, or one that names another
// file. An error is a failure to read the file.
func headerProblems(path, format string) ([]string, error) {
	// Non-blocking, so that opening a FIFO put in the file's place does not hang.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return []string{fmt.Sprintf("not a regular file (%s)", fi.Mode().Type())}, nil
	}
	head := make([]byte, min(fi.Size(), headLength))
	if _, err := io.ReadFull(f, head); err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	want := probedAs(format)
	if found := headerFormat(head); found != want {
		if found == "vmdk" && want == "raw" {
			found = "vmdk (or a vmdk descriptor)"
		}
		return []string{fmt.Sprintf("claims %s but is %s", format, found)}, nil
	}
	switch want {
	case "qcow2":
		return qcow2Problems(f, head), nil
	case "vmdk":
		return vmdkProblems(f, head, fi.Size()), nil
	}
	return nil, nil
}

// headerFormat names the format qemu's probe finds in a file starting with head, in qemu's
// names; "raw" when none.
func headerFormat(head []byte) string {
	has := func(off int, magic string) bool {
		return len(head) >= off+len(magic) && string(head[off:off+len(magic)]) == magic
	}
	switch {
	case has(0, "QFI\xfb"):
		if len(head) >= 8 && binary.BigEndian.Uint32(head[4:8]) >= 2 {
			return "qcow2"
		}
		return "qcow"
	case has(0, "QED\x00"):
		return "qed"
	case has(0, "KDMV"), has(0, "COWD"), vmdkDescriptorProbe(head[:min(len(head), probeLength)]):
		return "vmdk"
	case len(head) >= 68 && binary.LittleEndian.Uint32(head[64:68]) == 0xbeda107f:
		return "vdi"
	case has(0, "conectix"):
		return "vpc"
	case has(0, "vhdxfile"):
		return "vhdx"
	case has(0, "LUKS\xba\xbe"):
		return "luks"
	case has(0, "Bochs Virtual HD Image\x00"):
		return "bochs"
	case has(0, "WithoutFreeSpace"), has(0, "WithouFreSpacExt"):
		return "parallels"
	case has(0, "#!/bin/sh\n#V2.0 Format\n"):
		return "cloop"
	}
	return "raw"
}

// vmdkDescriptorProbe tells whether b reads as a vmdk descriptor to qemu's probe: comment
// and blank lines, then "version=N".
func vmdkDescriptorProbe(b []byte) bool {
	for len(b) > 0 {
		switch b[0] {
		case '#':
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				b = b[i+1:]
				continue
			}
			return false
		case ' ':
			b = bytes.TrimLeft(b, " ")
			b = bytes.TrimPrefix(b, []byte("\r"))
			if len(b) == 0 || b[0] != '\n' {
				return false
			}
			b = b[1:]
			continue
		}
		for _, v := range []string{"1", "2", "3"} {
			if bytes.HasPrefix(b, []byte("version="+v+"\n")) || bytes.HasPrefix(b, []byte("version="+v+"\r\n")) {
				return true
			}
		}
		return false
	}
	return false
}

// qcow2 header fields and extensions (qemu's docs/interop/qcow2.txt).
const (
	qcow2V2HeaderLength      = 72
	qcow2V3HeaderLength      = 104
	qcow2ExternalDataFileBit = 1 << 2
	qcow2ExtEnd              = 0
	qcow2ExtDataFile         = 0x44415441
	qcow2MaxBackingName      = 1023
)

// qcow2Problems lists the files other than itself that the qcow2 whose first bytes are
// head names: a backing file, an external data file (the incompatible-feature bit, or
// the header extension that names it).
func qcow2Problems(r io.ReaderAt, head []byte) []string {
	if len(head) < qcow2V2HeaderLength {
		return []string{"qcow2 header cut short"}
	}
	be := binary.BigEndian
	var out []string
	if off, n := be.Uint64(head[8:16]), be.Uint32(head[16:20]); off != 0 {
		name := make([]byte, min(n, qcow2MaxBackingName))
		if _, err := r.ReadAt(name, int64(off)); err != nil || n > qcow2MaxBackingName {
			out = append(out, "backing file (unreadable name)")
		} else {
			out = append(out, fmt.Sprintf("backing file %q", clip(string(name))))
		}
	}
	if be.Uint32(head[4:8]) < 3 {
		return out
	}
	if len(head) < qcow2V3HeaderLength {
		return append(out, "qcow2 header cut short")
	}
	dataFile := be.Uint64(head[72:80])&qcow2ExternalDataFileBit != 0
	// The extensions follow the header, up to the end of the first cluster.
	ext := head[min(int(be.Uint32(head[100:104])), len(head)):]
	if bits := be.Uint32(head[20:24]); bits < 31 && len(ext) > 1<<bits {
		ext = ext[:1<<bits]
	}
	for len(ext) >= 8 {
		typ, n := be.Uint32(ext[0:4]), int(be.Uint32(ext[4:8]))
		if typ == qcow2ExtEnd || n > len(ext)-8 {
			break
		}
		if typ == qcow2ExtDataFile {
			out = append(out, fmt.Sprintf("external data file %q", clip(string(ext[8:8+n]))))
			dataFile = false // named
		}
		ext = ext[min(8+(n+7)/8*8, len(ext)):]
	}
	if dataFile {
		out = append(out, "external data file (the qcow2 incompatible feature bit)")
	}
	return out
}

// vmdk sparse header fields (VMware's Virtual Disk Format 5.0), little-endian.
const (
	sectorBytes         = 512
	maxVMDKDescriptor   = 1 << 20 // qemu reads no more of one
	vmdkMonolithic      = "monolithicSparse"
	vmdkStreamOptimized = "streamOptimized"
)

// vmdkProblems lists why the vmdk whose first bytes are head must not reach qemu-img. Only
// a sparse vmdk holds its data in itself, and only a monolithicSparse or streamOptimized
// one has no other extent: a descriptor file, or another create type, names other files.
// qemu takes a sparse file's extents from its embedded descriptor when its capacity is 0,
// so that is refused too. The name of the one extent of an embedded descriptor is not
// compared with the file's: a downloaded file has been renamed, and qemu does not read it.
func vmdkProblems(r io.ReaderAt, head []byte, size int64) []string {
	if len(head) < 4 || string(head[:4]) != "KDMV" {
		if len(head) >= 4 && string(head[:4]) == "COWD" {
			return []string{"a VMware 3 (COWD) vmdk; only monolithicSparse and streamOptimized vmdks are accepted"}
		}
		createType, extents := parseVMDKDescriptor(head)
		return []string{fmt.Sprintf("a vmdk descriptor file (createType %q), whose extents are other files (%s)", clip(createType), quoteAll(extents))}
	}
	if len(head) < 44 {
		return []string{"vmdk header cut short"}
	}
	le := binary.LittleEndian
	capacity, descOff, descLen := le.Uint64(head[12:20]), le.Uint64(head[28:36]), le.Uint64(head[36:44])
	if descOff == 0 || descLen == 0 || descLen > maxVMDKDescriptor/sectorBytes ||
		descOff > uint64(size)/sectorBytes || descOff*sectorBytes+descLen*sectorBytes > uint64(size) {
		return []string{"a sparse vmdk without a readable embedded descriptor"}
	}
	desc := make([]byte, descLen*sectorBytes)
	if _, err := r.ReadAt(desc, int64(descOff*sectorBytes)); err != nil {
		return []string{"a sparse vmdk without a readable embedded descriptor"}
	}
	if i := bytes.IndexByte(desc, 0); i >= 0 {
		desc = desc[:i]
	}
	createType, extents := parseVMDKDescriptor(desc)
	var out []string
	if createType != vmdkMonolithic && createType != vmdkStreamOptimized {
		out = append(out, fmt.Sprintf("vmdk createType %q; only %s and %s are accepted", clip(createType), vmdkMonolithic, vmdkStreamOptimized))
	}
	if len(extents) != 1 || !strings.HasPrefix(extents[0].kind, "SPARSE") {
		out = append(out, fmt.Sprintf("a sparse vmdk whose descriptor names %d extents (%s), not itself alone", len(extents), quoteAll(extents)))
	}
	if capacity == 0 {
		out = append(out, "a sparse vmdk of capacity 0, whose extents qemu would take from its descriptor")
	}
	return out
}

type vmdkExtent struct{ kind, file string }

// parseVMDKDescriptor reads a vmdk descriptor's create type and extent lines
// ("RW 2048 FLAT "name" 0").
func parseVMDKDescriptor(desc []byte) (createType string, extents []vmdkExtent) {
	sc := bufio.NewScanner(bytes.NewReader(desc))
	sc.Buffer(nil, maxVMDKDescriptor)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "createType="); ok {
			createType = strings.Trim(v, `"`)
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 3 {
			continue
		}
		switch fields[0] {
		case "RW", "RDONLY", "NOACCESS":
			e := vmdkExtent{kind: fields[2]}
			if _, rest, ok := strings.Cut(line, `"`); ok {
				e.file, _, _ = strings.Cut(rest, `"`)
			}
			extents = append(extents, e)
		}
	}
	return createType, extents
}

func quoteAll(extents []vmdkExtent) string {
	if len(extents) == 0 {
		return "none"
	}
	s := make([]string, 0, 3)
	for _, e := range extents[:min(len(extents), 3)] {
		s = append(s, fmt.Sprintf("%s %q", clip(e.kind), clip(e.file)))
	}
	if len(extents) > 3 {
		s = append(s, fmt.Sprintf("and %d more", len(extents)-3))
	}
	return strings.Join(s, ", ")
}

// clip bounds a name read from the file, for a message.
func clip(s string) string {
	if len(s) > maxQuoted {
		return s[:maxQuoted] + "..."
	}
	return s
}

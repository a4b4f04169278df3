// Package gearman speaks gearmand's binary protocol and runs a worker that serves jobs
// from one or more job servers; it owns the wire format, the connections and job dispatch.
package gearman

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Type is the type of a packet, as numbered in gearmand's PROTOCOL document.
type Type uint32

// The packet types a worker sends or receives (and SUBMIT_JOB/JOB_CREATED, which a
// client uses, for tests and logs).
const (
	CanDo          Type = 1
	CantDo         Type = 2
	ResetAbilities Type = 3
	PreSleep       Type = 4
	Noop           Type = 6
	SubmitJob      Type = 7
	JobCreated     Type = 8
	GrabJob        Type = 9
	NoJob          Type = 10
	JobAssign      Type = 11
	WorkStatus     Type = 12
	WorkComplete   Type = 13
	WorkFail       Type = 14
	EchoReq        Type = 16
	EchoRes        Type = 17
	Error          Type = 19
	SetClientID    Type = 22
	WorkException  Type = 25
	WorkData       Type = 28
	WorkWarning    Type = 29
	GrabJobUniq    Type = 30
	JobAssignUniq  Type = 31
)

// typeInfo is a type's name in the PROTOCOL document and how many NUL-separated
// arguments its data holds; the last argument takes the rest of the data, NULs included.
var typeInfo = map[Type]struct {
	name string
	args int
}{
	CanDo:          {"CAN_DO", 1},
	CantDo:         {"CANT_DO", 1},
	ResetAbilities: {"RESET_ABILITIES", 0},
	PreSleep:       {"PRE_SLEEP", 0},
	Noop:           {"NOOP", 0},
	SubmitJob:      {"SUBMIT_JOB", 3},
	JobCreated:     {"JOB_CREATED", 1},
	GrabJob:        {"GRAB_JOB", 0},
	NoJob:          {"NO_JOB", 0},
	JobAssign:      {"JOB_ASSIGN", 3},
	WorkStatus:     {"WORK_STATUS", 3},
	WorkComplete:   {"WORK_COMPLETE", 2},
	WorkFail:       {"WORK_FAIL", 1},
	EchoReq:        {"ECHO_REQ", 1},
	EchoRes:        {"ECHO_RES", 1},
	Error:          {"ERROR", 2},
	SetClientID:    {"SET_CLIENT_ID", 1},
	WorkException:  {"WORK_EXCEPTION", 2},
	WorkData:       {"WORK_DATA", 2},
	WorkWarning:    {"WORK_WARNING", 2},
	GrabJobUniq:    {"GRAB_JOB_UNIQ", 0},
	JobAssignUniq:  {"JOB_ASSIGN_UNIQ", 4},
}

// String is the type's name in the PROTOCOL document, or its number when unknown.
func (t Type) String() string {
	if info, ok := typeInfo[t]; ok {
		return info.name
	}
	return "TYPE_" + strconv.FormatUint(uint64(t), 10)
}

// Args is how many arguments a packet of this type carries; an unknown type is read
// as one opaque argument, or none when its data is empty.
func (t Type) Args() (n int, known bool) {
	info, ok := typeInfo[t]
	return info.args, ok
}

// Magic codes open every packet: requests come from clients and workers, responses
// from the server.
const (
	magicReq = "\x00REQ"
	magicRes = "\x00RES"
)

// headerSize is the magic, the type and the data size.
const headerSize = 12

// MaxDataSize bounds the data of a packet this package reads or writes. Job data and
// results here are names and ids; a larger size means a broken or hostile peer, whose
// packet would otherwise make us allocate whatever it claims.
const MaxDataSize = 1 << 20

// Errors a malformed packet gives, for errors.Is.
var (
	ErrBadMagic = errors.New("bad packet magic")
	ErrTooLarge = errors.New("packet too large")
	ErrBadArgs  = errors.New("bad packet arguments")
)

// Packet is one packet of the binary protocol.
type Packet struct {
	// Response is true for a packet from the server (\0RES), false for one to it (\0REQ).
	Response bool
	Type     Type
	// Args are the packet's arguments. Only the last may contain NUL bytes.
	Args [][]byte
}

// Req is a request packet (worker or client to server) with string arguments.
func Req(t Type, args ...string) Packet {
	return Packet{Type: t, Args: stringArgs(args)}
}

func stringArgs(args []string) [][]byte {
	out := make([][]byte, len(args))
	for i, a := range args {
		out[i] = []byte(a)
	}
	return out
}

// Arg is argument i as a string, or "" when the packet has fewer arguments.
func (p Packet) Arg(i int) string {
	if i < len(p.Args) {
		return string(p.Args[i])
	}
	return ""
}

// String shows the packet for logs and test failures.
func (p Packet) String() string {
	dir := "REQ"
	if p.Response {
		dir = "RES"
	}
	return fmt.Sprintf("%s %s %q", dir, p.Type, bytes.Join(p.Args, []byte{0}))
}

// data is the arguments joined by NUL bytes.
func (p Packet) data() ([]byte, error) {
	for i, a := range p.Args {
		if i < len(p.Args)-1 && bytes.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("%s: argument %d contains a NUL byte: %w", p.Type, i+1, ErrBadArgs)
		}
	}
	return bytes.Join(p.Args, []byte{0}), nil
}

// MarshalBinary encodes the packet: magic, big-endian type and size, then the data.
// It fails when an argument other than the last holds a NUL byte, which would shift
// the arguments the peer reads, or when the data exceeds MaxDataSize.
func (p Packet) MarshalBinary() ([]byte, error) {
	data, err := p.data()
	if err != nil {
		return nil, err
	}
	if len(data) > MaxDataSize {
		return nil, fmt.Errorf("%s: %d bytes of data, more than %d: %w", p.Type, len(data), MaxDataSize, ErrTooLarge)
	}
	b := make([]byte, headerSize, headerSize+len(data))
	magic := magicReq
	if p.Response {
		magic = magicRes
	}
	copy(b, magic)
	binary.BigEndian.PutUint32(b[4:], uint32(p.Type))
	binary.BigEndian.PutUint32(b[8:], uint32(len(data)))
	return append(b, data...), nil
}

// ReadPacket reads one packet from r. It refuses a bad magic and data over MaxDataSize
// before reading the data, and a known type whose data has too few arguments. A
// stream that ends inside a packet gives io.ErrUnexpectedEOF; one that ends between
// packets gives io.EOF.
func ReadPacket(r io.Reader) (Packet, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Packet{}, fmt.Errorf("read packet header: %w", err)
		}
		return Packet{}, err
	}
	var p Packet
	switch string(h[:4]) {
	case magicReq:
	case magicRes:
		p.Response = true
	default:
		return Packet{}, fmt.Errorf("packet starts with %q, want \\0REQ or \\0RES (not a gearman server?): %w", h[:4], ErrBadMagic)
	}
	p.Type = Type(binary.BigEndian.Uint32(h[4:]))
	size := binary.BigEndian.Uint32(h[8:])
	if size > MaxDataSize {
		return Packet{}, fmt.Errorf("%s packet of %d bytes, more than %d: %w", p.Type, size, MaxDataSize, ErrTooLarge)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Packet{}, fmt.Errorf("read %s packet data (%d bytes): %w", p.Type, size, err)
	}
	n, known := p.Type.Args()
	if !known {
		n = 1
		if size == 0 {
			n = 0
		}
	}
	switch {
	case n == 0 && size > 0:
		return Packet{}, fmt.Errorf("%s packet with %d bytes of data, want none: %w", p.Type, size, ErrBadArgs)
	case n == 0:
		return p, nil
	}
	p.Args = bytes.SplitN(data, []byte{0}, n)
	if len(p.Args) < n {
		return Packet{}, fmt.Errorf("%s packet with %d arguments, want %d: %w", p.Type, len(p.Args), n, ErrBadArgs)
	}
	return p, nil
}

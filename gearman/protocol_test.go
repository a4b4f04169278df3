package gearman

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// hexPacket builds the bytes of a packet from its parts, the way the PROTOCOL document
// lays out its examples: magic, type, size, data.
func hexPacket(magic string, typ, size uint32, data string) []byte {
	b := []byte(magic)
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, size)
	return append(b, data...)
}

// TestProtocolDocumentExample is the "reverse" exchange of gearmand's PROTOCOL
// document, byte for byte, both ways.
func TestProtocolDocumentExample(t *testing.T) {
	tests := []struct {
		name string
		p    Packet
		wire []byte
	}{
		{"CAN_DO", Req(CanDo, "reverse"),
			[]byte{0x00, 0x52, 0x45, 0x51, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x07, 0x72, 0x65, 0x76, 0x65, 0x72, 0x73, 0x65}},
		{"SUBMIT_JOB", Req(SubmitJob, "reverse", "", "test"), hexPacket("\x00REQ", 7, 13, "reverse\x00\x00test")},
		{"JOB_CREATED", resPacket(JobCreated, "H:lap:1"), hexPacket("\x00RES", 8, 7, "H:lap:1")},
		{"GRAB_JOB", Req(GrabJob), hexPacket("\x00REQ", 9, 0, "")},
		{"NO_JOB", resPacket(NoJob), hexPacket("\x00RES", 10, 0, "")},
		{"PRE_SLEEP", Req(PreSleep), hexPacket("\x00REQ", 4, 0, "")},
		{"NOOP", resPacket(Noop), hexPacket("\x00RES", 6, 0, "")},
		{"JOB_ASSIGN", resPacket(JobAssign, "H:lap:1", "reverse", "test"), hexPacket("\x00RES", 11, 20, "H:lap:1\x00reverse\x00test")},
		{"WORK_COMPLETE", Req(WorkComplete, "H:lap:1", "tset"), hexPacket("\x00REQ", 13, 12, "H:lap:1\x00tset")},
		// The worker-side packets this package uses beyond the example.
		{"GRAB_JOB_UNIQ", Req(GrabJobUniq), hexPacket("\x00REQ", 30, 0, "")},
		{"JOB_ASSIGN_UNIQ", resPacket(JobAssignUniq, "H:lap:1", "reverse", "KEY", "test"), hexPacket("\x00RES", 31, 24, "H:lap:1\x00reverse\x00KEY\x00test")},
		{"WORK_STATUS", Req(WorkStatus, "H:lap:1", "1", "2"), hexPacket("\x00REQ", 12, 11, "H:lap:1\x001\x002")},
		{"WORK_DATA", Req(WorkData, "H:lap:1", "no such build"), hexPacket("\x00REQ", 28, 21, "H:lap:1\x00no such build")},
		{"WORK_FAIL", Req(WorkFail, "H:lap:1"), hexPacket("\x00REQ", 14, 7, "H:lap:1")},
		{"SET_CLIENT_ID", Req(SetClientID, "builder01"), hexPacket("\x00REQ", 22, 9, "builder01")},
		{"ECHO_RES", resPacket(EchoRes, "ping"), hexPacket("\x00RES", 17, 4, "ping")},
		{"ERROR", resPacket(Error, "JOB_NOT_FOUND", "Job given in work result not found"),
			hexPacket("\x00RES", 19, 48, "JOB_NOT_FOUND\x00Job given in work result not found")},
		{"empty last argument", Req(WorkComplete, "H:lap:1", ""), hexPacket("\x00REQ", 13, 8, "H:lap:1\x00")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.p.MarshalBinary()
			if err != nil {
				t.Fatalf("encode %v: %v", tt.p, err)
			}
			if !bytes.Equal(got, tt.wire) {
				t.Errorf("encode %v:\n got % x\nwant % x", tt.p, got, tt.wire)
			}
			back, err := ReadPacket(bytes.NewReader(tt.wire))
			if err != nil {
				t.Fatalf("decode % x: %v", tt.wire, err)
			}
			if !reflect.DeepEqual(normalize(back), normalize(tt.p)) {
				t.Errorf("decode % x = %v, want %v", tt.wire, back, tt.p)
			}
		})
	}
}

// normalize makes empty argument lists and arguments compare equal however built.
func normalize(p Packet) Packet {
	if len(p.Args) == 0 {
		p.Args = nil
	}
	for i, a := range p.Args {
		if len(a) == 0 {
			p.Args[i] = []byte{}
		}
	}
	return p
}

func TestPacketDataKeepsNULs(t *testing.T) {
	data := "a\x00b\x00\x00c"
	p := Req(WorkComplete, "H:x:1", data)
	var buf bytes.Buffer
	if err := writePacket(&buf, p); err != nil {
		t.Fatal(err)
	}
	// A stream of packets reads back one by one, then io.EOF.
	if err := writePacket(&buf, resPacket(Noop)); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPacket(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got.Arg(0) != "H:x:1" || got.Arg(1) != data || len(got.Args) != 2 {
		t.Errorf("read %v, want handle and data %q", got, data)
	}
	if got, err := ReadPacket(&buf); err != nil || got.Type != Noop || !got.Response {
		t.Errorf("second packet = %v, %v; want RES NOOP", got, err)
	}
	if _, err := ReadPacket(&buf); err != io.EOF {
		t.Errorf("read at the end of the stream: %v, want io.EOF", err)
	}
}

func TestPacketUnknownType(t *testing.T) {
	wire := hexPacket("\x00RES", 99, 3, "a\x00b")
	p, err := ReadPacket(bytes.NewReader(wire))
	if err != nil {
		t.Fatal(err)
	}
	if p.Type.String() != "TYPE_99" || len(p.Args) != 1 || p.Arg(0) != "a\x00b" {
		t.Errorf("unknown type read as %v", p)
	}
	if p, err := ReadPacket(bytes.NewReader(hexPacket("\x00RES", 99, 0, ""))); err != nil || len(p.Args) != 0 {
		t.Errorf("empty unknown packet = %v, %v", p, err)
	}
}

func TestPacketErrors(t *testing.T) {
	tests := []struct {
		name    string
		wire    []byte
		is      error
		message string
	}{
		{"HTTP instead of gearman", []byte("HTTP/1.1 400 Bad Request\r\n"), ErrBadMagic, `packet starts with "HTTP"`},
		{"request magic misspelt", hexPacket("\x00REZ", 6, 0, ""), ErrBadMagic, "want \\0REQ or \\0RES"},
		{"oversized", hexPacket("\x00RES", 31, MaxDataSize+1, ""), ErrTooLarge, "JOB_ASSIGN_UNIQ packet of 1048577 bytes, more than 1048576"},
		{"huge size", hexPacket("\x00RES", 13, 0xffffffff, "x"), ErrTooLarge, "more than"},
		{"truncated header", []byte("\x00RES\x00\x00"), io.ErrUnexpectedEOF, "read packet header"},
		{"truncated data", hexPacket("\x00RES", 11, 20, "H:lap:1\x00rev"), io.ErrUnexpectedEOF, "read JOB_ASSIGN packet data (20 bytes)"},
		{"too few arguments", hexPacket("\x00RES", 31, 8, "H:1\x00fn\x00u"), ErrBadArgs, "JOB_ASSIGN_UNIQ packet with 3 arguments, want 4"},
		{"data where none belongs", hexPacket("\x00RES", 6, 1, "x"), ErrBadArgs, "NOOP packet with 1 bytes of data, want none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ReadPacket(bytes.NewReader(tt.wire))
			if err == nil {
				t.Fatalf("read % x = %v, want an error", tt.wire, p)
			}
			if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.message) {
				t.Errorf("read % x: %v; want %v saying %q", tt.wire, err, tt.is, tt.message)
			}
		})
	}
}

// An oversized packet is refused from its header, before its data is read or allocated.
func TestPacketOversizedNotRead(t *testing.T) {
	r := &countingReader{r: io.MultiReader(bytes.NewReader(hexPacket("\x00RES", 13, 64<<20, "")), zeros{})}
	if _, err := ReadPacket(r); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("read: %v, want ErrTooLarge", err)
	}
	if r.n != headerSize {
		t.Errorf("read %d bytes, want only the %d of the header", r.n, headerSize)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestPacketEncodeErrors(t *testing.T) {
	if _, err := Req(CanDo, "a\x00b", "x").MarshalBinary(); !errors.Is(err, ErrBadArgs) || !strings.Contains(err.Error(), "argument 1 contains a NUL") {
		t.Errorf("NUL in a leading argument: %v, want ErrBadArgs", err)
	}
	big := strings.Repeat("x", MaxDataSize)
	if _, err := Req(WorkComplete, "H:1", big).MarshalBinary(); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized data: %v, want ErrTooLarge", err)
	}
	if err := writePacket(io.Discard, Req(WorkComplete, "H:1", big[:MaxDataSize-4])); err != nil {
		t.Errorf("data of exactly MaxDataSize: %v", err)
	}
}

func TestTypeString(t *testing.T) {
	for typ, want := range map[Type]string{CanDo: "CAN_DO", JobAssignUniq: "JOB_ASSIGN_UNIQ", WorkException: "WORK_EXCEPTION", 0: "TYPE_0"} {
		if got := typ.String(); got != want {
			t.Errorf("Type(%d) = %q, want %q", uint32(typ), got, want)
		}
	}
	if got := resPacket(JobAssign, "H:1", "f", "d\x00").String(); got != `RES JOB_ASSIGN "H:1\x00f\x00d\x00"` {
		t.Errorf("Packet.String = %s", got)
	}
}

// resPacket is a response packet (server to worker or client) with string arguments.
func resPacket(t Type, args ...string) Packet {
	return Packet{Response: true, Type: t, Args: stringArgs(args)}
}

// writePacket encodes p and writes it to w in one Write.
func writePacket(w io.Writer, p Packet) error {
	b, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

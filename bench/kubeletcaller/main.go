// Command kubeletcaller makes unary gRPC calls over a unix socket the way the
// kubelet does (Go, grpc-go) and times them, for bench/deviceplugin_bench.py.
//
// Usage: kubeletcaller SOCKET METHOD REQUEST_HEX
//
// For each line read on stdin it makes one call of METHOD with the serialized
// request and prints the call's wall-clock time in nanoseconds on a line of its
// own, or "error: ..." when the call fails. The bytes travel as they are (a
// codec that does not marshal), so no generated Go code is needed.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
)

type rawBytes struct{}

func (rawBytes) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawBytes) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawBytes) Name() string { return "proto" }

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: kubeletcaller SOCKET METHOD REQUEST_HEX")
		os.Exit(2)
	}
	request, err := hex.DecodeString(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "REQUEST_HEX:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, os.Args[1], grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	lines := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for lines.Scan() {
		var reply []byte
		started := time.Now()
		err := conn.Invoke(context.Background(), os.Args[2], &request, &reply,
			grpc.ForceCodec(rawBytes{}))
		elapsed := time.Since(started)
		if err != nil {
			fmt.Fprintf(out, "error: %v\n", err)
		} else {
			fmt.Fprintf(out, "%d\n", elapsed.Nanoseconds())
		}
		out.Flush()
	}
}

// Command bench is the app of the middleware load bench (issue 37,
// bench/scripts/middleware.sh): POST /pay counts its executions and answers
// 201 {"ok":true,"execution":N}, with or without the idempotency middleware
// in front, so that the difference between the two runs is the middleware's
// cost and nothing else.
//
//	go run ./bench --framework nethttp --middleware on --port 0 --idemd 127.0.0.1:50051
//
// When it serves it prints "listening on PORT" (one line, stdout); SIGTERM
// stops it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
)

func main() {
	framework := flag.String("framework", "nethttp", "the HTTP framework: nethttp (the middleware on a net/http ServeMux)")
	middleware := flag.String("middleware", "on", "on: the idempotency middleware wraps /pay; off: the bare app")
	port := flag.Int("port", 0, "port on 127.0.0.1 (0: any free one)")
	idemdAddr := flag.String("idemd", "127.0.0.1:50051", "idemd's gRPC address (plaintext, tenant bench)")
	flag.Parse()
	if *framework != "nethttp" {
		log.Fatalf("bench: --framework %q: only nethttp", *framework)
	}
	if *middleware != "on" && *middleware != "off" {
		log.Fatalf("bench: --middleware %q: on or off", *middleware)
	}

	var executions atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /pay", func(w http.ResponseWriter, r *http.Request) {
		n := executions.Add(1)
		body := `{"ok":true,"execution":` + strconv.FormatInt(n, 10) + `}`
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(body))
	})
	var handler http.Handler = mux
	if *middleware == "on" {
		client, err := idemd.New(*idemdAddr, idemd.WithInsecure(), idemd.WithTenant("bench"))
		if err != nil {
			log.Fatal(err)
		}
		defer client.Close()
		mw, err := idemd.Middleware(client, idemd.RoutesConfig{Routes: []idemd.Route{{Path: "/pay"}}})
		if err != nil {
			log.Fatal(err)
		}
		handler = mw(mux)
	}

	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
	if err != nil {
		log.Fatal(err)
	}
	server := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	// Stdout is unbuffered in Go: the line is out when Println returns.
	fmt.Println("listening on", listener.Addr().(*net.TCPAddr).Port)

	select {
	case err := <-served:
		log.Fatal(err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := server.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Print(err)
	}
}

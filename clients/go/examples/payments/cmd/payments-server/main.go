// Command payments-server runs the example payments API in front of idemd.
//
//	IDEMD_ADDR=localhost:50051 IDEMD_TOKEN=... IDEMD_PLAINTEXT=1 LISTEN=:8080 payments-server
//	curl -i -X POST localhost:8080/v1/payments -H 'Idempotency-Key: 4f8c2a1e' \
//	  -H 'Content-Type: application/json' -d '{"amount":4200,"currency":"usd","customer":"cus_8812"}'
package main

import (
	"log"
	"net/http"
	"os"
	"time"

	idemd "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/examples/payments"
)

func main() {
	opts := []idemd.Option{idemd.WithToken(os.Getenv("IDEMD_TOKEN"))}
	if os.Getenv("IDEMD_PLAINTEXT") != "" {
		opts = append(opts, idemd.WithInsecure())
	}
	client, err := idemd.New(os.Getenv("IDEMD_ADDR"), opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	listen := os.Getenv("LISTEN")
	if listen == "" {
		listen = ":8080"
	}
	handler, err := (&payments.Server{Idemd: client, Provider: &payments.FakeProvider{}, MaxWait: 5 * time.Second}).Handler()
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{
		Addr:              listen,
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Printf("payments example listening on %s", listen)
	log.Fatal(srv.ListenAndServe())
}

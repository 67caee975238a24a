// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tokenwarden/tokenwarden/proxy/server"
)

// drainOptions say how a stopping proxy drains.
type drainOptions struct {
	// delay is the time between /readyz failing and the listener closing, for the
	// endpoints to stop sending new requests.
	delay time.Duration
	// timeout bounds the wait for requests and streams in flight; 0 derives it from
	// the config in force (config.DrainTimeout).
	timeout time.Duration
}

// inFlight counts the requests being served, so that a drain cut short by its timeout
// still waits for their handlers, which settle or release every hold as they return.
type inFlight struct {
	h  http.Handler
	wg sync.WaitGroup
}

func (f *inFlight) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.wg.Add(1)
	defer f.wg.Done()
	f.h.ServeHTTP(w, r)
}

// serve runs the data and admin servers until ctx ends (SIGTERM), then drains:
//
//  1. /readyz answers 503 (the endpoints drop the pod) while requests are still served;
//  2. after o.delay the data listener closes: new connections are refused;
//  3. requests and streams in flight finish, for at most the drain timeout, after
//     which the ones left are cut (a cut stream settles on what it carried);
//  4. every hold is settled or released (settlements running off the request
//     goroutines included), then the admin server stops.
func serve(ctx context.Context, log *slog.Logger, srv *server.Server, adminHandler http.Handler, lnData, lnAdmin net.Listener, o drainOptions) error {
	handler := &inFlight{h: srv}
	data := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	admin := &http.Server{Handler: adminHandler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- data.Serve(lnData) }()
	go func() { errc <- admin.Serve(lnAdmin) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		_ = data.Close()
		_ = admin.Close()
		return err
	}

	timeout := o.timeout
	if timeout <= 0 {
		timeout = srv.DrainTimeout()
	}
	log.Info("Draining: /readyz answers 503, requests in flight finish", "delay", o.delay.String(), "timeout", timeout.String())
	srv.StartDrain()
	time.Sleep(o.delay)

	deadline, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := data.Shutdown(deadline); err != nil {
		log.Warn("The drain timeout passed; cutting the requests still in flight", "timeout", timeout.String(), "error", err)
		_ = data.Close()
	}
	settle, cancelSettle := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelSettle()
	var errs []error
	done := make(chan struct{})
	go func() {
		handler.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		if err := srv.WaitSettled(settle); err != nil {
			errs = append(errs, err)
		}
	case <-settle.Done():
		errs = append(errs, settle.Err())
	}
	if len(errs) > 0 {
		log.Error("Some holds were not settled before stopping", "error", errors.Join(errs...))
	} else {
		log.Info("Drained: every hold is settled or released")
	}
	return admin.Shutdown(settle)
}

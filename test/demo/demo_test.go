// Copyright 2026 The tokenwarden Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// burnerEnv makes the test binary a CPU burner instead of running the tests: the
// demo's test starts one per core, so the story runs on a loaded machine.
const burnerEnv = "TOKENWARDEN_DEMO_CPU_BURNER"

func TestMain(m *testing.M) {
	if os.Getenv(burnerEnv) == "1" {
		burn()
		return
	}
	os.Exit(m.Run())
}

// burn keeps one core busy until its parent (the test) goes away, or for half an
// hour at most, should it never be killed.
func burn() {
	parent := os.Getppid()
	for deadline := time.Now().Add(30 * time.Minute); time.Now().Before(deadline) && os.Getppid() == parent; {
		for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		}
	}
}

func TestDemo(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Demo Suite")
}

var root, proxyBinary, pluginDir string

var _ = BeforeSuite(func() {
	var err error
	root, err = filepath.Abs(filepath.Join("..", ".."))
	Expect(err).NotTo(HaveOccurred())
	// The proxy binary under test, built from this tree, as the end-to-end suite does.
	proxyBinary = filepath.Join(GinkgoT().TempDir(), "proxy")
	build := exec.Command("go", "build", "-o", proxyBinary, "./proxy/cmd/proxy")
	build.Dir = root
	out, err := build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s", out)
	// And the kubectl plugin the story ends with.
	pluginDir = GinkgoT().TempDir()
	build = exec.Command("go", "build", "-o", filepath.Join(pluginDir, "kubectl-tokenwarden"), "./plugin/cmd/kubectl-tokenwarden")
	build.Dir = root
	out, err = build.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s", out)
})

// loadEveryCore starts one CPU burner process per core, as another workload on the
// machine would be, and stops them when the spec ends.
func loadEveryCore() {
	GinkgoHelper()
	for i := 0; i < runtime.NumCPU(); i++ {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), burnerEnv+"=1")
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

var _ = Describe("make demo DEMO_ONCE=1", func() {
	It("tells the whole story, every step as told, with every core of the machine busy", func(ctx SpecContext) {
		if testing.Short() {
			Skip("the demo runs the whole system; -short skips it")
		}
		logPath := filepath.Join(GinkgoT().TempDir(), "demo.log")
		DeferCleanup(func() {
			if CurrentSpecReport().Failed() {
				log, _ := os.ReadFile(logPath)
				if lines := bytes.Split(log, []byte("\n")); len(lines) > 200 {
					log = bytes.Join(lines[len(lines)-200:], []byte("\n"))
				}
				GinkgoWriter.Printf("The last lines of the control plane's and the operator's log:\n%s\n", log)
			}
		})
		loadEveryCore()
		GinkgoWriter.Printf("%d CPU burners run while the story is told.\n", runtime.NumCPU())

		start := time.Now()
		Expect(run(ctx, options{Root: root, Once: true, ProxyBinary: proxyBinary, PluginDir: pluginDir, LogPath: logPath, NeedRedis: true})).To(Succeed())
		AddReportEntry("the story's duration with every core busy", time.Since(start).Round(time.Millisecond).String())
	}, SpecTimeout(15*time.Minute))
})

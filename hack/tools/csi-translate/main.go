// Command csi-translate runs k8s.io/csi-translation-lib (the version pinned in
// ../go.mod) over cases read from stdin, one JSON object per line, and prints one
// JSON object per line. The Rust differential test (tests/migration.rs) feeds the
// same cases to src/migration and compares.
//
// Input lines:
//
//	{"pv": <PersistentVolume>}
//	{"repair": {"driver": "...", "handle": "...", "nodeID": "..."}}
//
// Output lines:
//
//	{"migratable": bool, "driver": "<CSI driver or empty>", "pv": <translated PV>}  or  {..., "error": "..."}
//	{"handle": "..."}  or  {"error": "..."}
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

type repairCase struct {
	Driver string `json:"driver"`
	Handle string `json:"handle"`
	NodeID string `json:"nodeID"`
}

type inputCase struct {
	PV     *v1.PersistentVolume `json:"pv,omitempty"`
	Repair *repairCase          `json:"repair,omitempty"`
}

type output struct {
	Migratable *bool                `json:"migratable,omitempty"`
	Driver     string               `json:"driver,omitempty"`
	PV         *v1.PersistentVolume `json:"pv,omitempty"`
	Handle     *string              `json:"handle,omitempty"`
	Error      string               `json:"error,omitempty"`
}

func run(translator csitrans.CSITranslator, line []byte) output {
	var in inputCase
	if err := json.Unmarshal(line, &in); err != nil {
		return output{Error: fmt.Sprintf("bad input: %v", err)}
	}
	switch {
	case in.Repair != nil:
		handle, err := translator.RepairVolumeHandle(in.Repair.Driver, in.Repair.Handle, in.Repair.NodeID)
		if err != nil {
			return output{Error: err.Error()}
		}
		return output{Handle: &handle}
	case in.PV != nil:
		migratable := translator.IsPVMigratable(in.PV)
		out := output{Migratable: &migratable}
		if !migratable {
			return out
		}
		if plugin, err := translator.GetInTreePluginNameFromSpec(in.PV, nil); err == nil {
			out.Driver, _ = translator.GetCSINameFromInTreeName(plugin)
		}
		pv, err := translator.TranslateInTreePVToCSI(klog.Background(), in.PV)
		if err != nil {
			out.Error = err.Error()
			return out
		}
		out.PV = pv
		return out
	default:
		return output{Error: "bad input: neither pv nor repair"}
	}
}

func main() {
	translator := csitrans.New()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		if err := out.Encode(run(translator, in.Bytes())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// Command csi-test-driver serves the CSI mock driver of csi-test
// (github.com/kubernetes-csi/csi-test/v5/driver: gomock servers behind a real
// gRPC server) on a Unix socket. Requests are decoded by the official CSI Go
// bindings, so a client that works against it speaks the CSI wire format.
//
// Every Controller request is appended to --record as one JSON line
// {"method": ..., "request": <protojson with proto field names>}, which lets
// the Rust interop tests compare what the Go side decoded, field by field.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/golang/mock/gomock"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// reporter lets gomock run outside `go test`: an unexpected call is fatal.
type reporter struct{}

func (reporter) Errorf(format string, args ...any) { log.Printf(format, args...) }
func (reporter) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }

// state is the published table: volume ID -> node IDs.
type state struct {
	mu        sync.Mutex
	published map[string]map[string]bool
	record    *os.File
}

func (s *state) log(method string, req proto.Message) {
	body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(req)
	if err != nil {
		log.Fatalf("marshal %s: %v", method, err)
	}
	line, err := json.Marshal(map[string]any{"method": method, "request": json.RawMessage(body)})
	if err != nil {
		log.Fatalf("marshal record: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.record.Write(append(line, '\n')); err != nil {
		log.Fatalf("write record: %v", err)
	}
}

func main() {
	endpoint := flag.String("endpoint", "", "Unix socket path to serve on")
	name := flag.String("name", "csi-test.example.com", "driver name returned by GetPluginInfo")
	recordPath := flag.String("record", "", "file that receives one JSON line per Controller request")
	flag.Parse()
	if *endpoint == "" || *recordPath == "" {
		log.Fatal("--endpoint and --record are required")
	}
	record, err := os.OpenFile(*recordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Fatalf("open record: %v", err)
	}
	s := &state{published: map[string]map[string]bool{}, record: record}

	ctrl := gomock.NewController(reporter{})
	identity := driver.NewMockIdentityServer(ctrl)
	controller := driver.NewMockControllerServer(ctrl)
	any := gomock.Any()

	identity.EXPECT().Probe(any, any).AnyTimes().
		Return(&csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil)
	identity.EXPECT().GetPluginInfo(any, any).AnyTimes().
		Return(&csi.GetPluginInfoResponse{Name: *name, VendorVersion: "csi-test-v5.4.0"}, nil)
	identity.EXPECT().GetPluginCapabilities(any, any).AnyTimes().
		Return(&csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
				Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
			}},
		}}}, nil)

	var ctrlCaps []*csi.ControllerServiceCapability
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		ctrlCaps = append(ctrlCaps, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	controller.EXPECT().ControllerGetCapabilities(any, any).AnyTimes().
		Return(&csi.ControllerGetCapabilitiesResponse{Capabilities: ctrlCaps}, nil)

	controller.EXPECT().ControllerPublishVolume(any, any).AnyTimes().DoAndReturn(
		func(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
			s.log("ControllerPublishVolume", req)
			if req.GetVolumeId() == "" || req.GetNodeId() == "" || req.GetVolumeCapability() == nil {
				return nil, status.Error(codes.InvalidArgument, "volume_id, node_id and volume_capability are required")
			}
			if req.GetVolumeId() == "missing-volume" {
				return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.published[req.GetVolumeId()] == nil {
				s.published[req.GetVolumeId()] = map[string]bool{}
			}
			s.published[req.GetVolumeId()][req.GetNodeId()] = true
			return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{
				"device":   "/dev/mock/" + req.GetVolumeId(),
				"readonly": strconv.FormatBool(req.GetReadonly()),
			}}, nil
		})
	controller.EXPECT().ControllerUnpublishVolume(any, any).AnyTimes().DoAndReturn(
		func(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
			s.log("ControllerUnpublishVolume", req)
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.published[req.GetVolumeId()], req.GetNodeId())
			if len(s.published[req.GetVolumeId()]) == 0 {
				delete(s.published, req.GetVolumeId())
			}
			return &csi.ControllerUnpublishVolumeResponse{}, nil
		})
	controller.EXPECT().ListVolumes(any, any).AnyTimes().DoAndReturn(
		func(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
			s.log("ListVolumes", req)
			s.mu.Lock()
			defer s.mu.Unlock()
			ids := make([]string, 0, len(s.published))
			for id := range s.published {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			start := 0
			if tok := req.GetStartingToken(); tok != "" {
				n, err := strconv.Atoi(tok)
				if err != nil || n < 0 || n > len(ids) {
					return nil, status.Errorf(codes.Aborted, "invalid starting_token %q", tok)
				}
				start = n
			}
			end := len(ids)
			if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
				end = start + m
			}
			resp := &csi.ListVolumesResponse{}
			for _, id := range ids[start:end] {
				nodes := make([]string, 0, len(s.published[id]))
				for n := range s.published[id] {
					nodes = append(nodes, n)
				}
				sort.Strings(nodes)
				resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{
					Volume: &csi.Volume{VolumeId: id},
					Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: nodes},
				})
			}
			if end < len(ids) {
				resp.NextToken = strconv.Itoa(end)
			}
			return resp, nil
		})

	_ = os.Remove(*endpoint)
	d := driver.NewMockCSIDriver(&driver.MockCSIDriverServers{Identity: identity, Controller: controller})
	if err := d.StartOnAddress("unix", *endpoint); err != nil {
		log.Fatalf("listen on %s: %v", *endpoint, err)
	}
	fmt.Fprintf(os.Stderr, "csi-test-driver %s serving on %s\n", *name, *endpoint)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	d.Stop()
}

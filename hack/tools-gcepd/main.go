// Command gce-pd-driver serves the GCE PD CSI driver's controller
// (sigs.k8s.io/gcp-compute-persistent-disk-csi-driver, pinned in go.mod) on a
// Unix socket, backed by the driver's own fake compute provider instead of the
// Compute Engine API, for tests/gce_pd.rs. It is put together the way the
// driver's test/sanity test does it (gce.CreateFakeCloudProvider,
// driver.NewControllerServer, SetupGCEDriver, Run); the instances and zonal
// disks named by the flags are seeded into the fake before it serves.
//
// Everything between the CSI request and the fake provider is the driver's
// real code: request validation, node ID and volume handle parsing, the
// UNSPECIFIED project/zone repair, the per-(node, volume) lock, the
// per-(node, volume) error backoff, and the mapping of errors to gRPC codes.
// The backoff flags and their defaults are the driver's own
// (cmd/gce-pd-csi-driver/main.go).
//
// Two additions to the fake provider, both in lockedProvider: it has no
// locking (the sanity test calls it from one goroutine at a time) and an
// attacher publishes concurrently, so its instance and disk reads and
// attach/detach writes go through one mutex here (Compute Engine itself
// serializes operations on an instance); and its AttachDisk/DetachDisk do not
// maintain a disk's users, which the driver's ListVolumes reports as published
// nodes (the attacher's reconciler reads them), so the wrapper keeps the
// seeded disks' users as Compute Engine does.
//
// --instances-on-sigusr1 names instances that appear only when the process
// gets SIGUSR1, so a test can make a failing attach succeed.
//
// Built by: hack/build-gotool.sh tools-gcepd gce-pd-driver github.com/csi-attacher-rs/hack/tools-gcepd
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/GoogleCloudPlatform/k8s-cloud-provider/pkg/cloud/meta"
	computev1 "google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
	"k8s.io/klog/v2"

	gce "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver/pkg/gce-cloud-provider/compute"
	driver "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver/pkg/gce-pd-csi-driver"
)

var (
	endpoint      = flag.String("endpoint", "", "CSI endpoint, unix:///path/to/csi.sock")
	driverName    = flag.String("driver-name", "pd.csi.storage.gke.io", "the name GetPluginInfo answers")
	project       = flag.String("project", "test-project", "the fake provider's default project (UNSPECIFIED projects resolve to it)")
	zone          = flag.String("zone", "us-central1-c", "the fake provider's default zone, {locale}-{region}-{zone}")
	instances     = flag.String("instances", "", "comma-separated instance names to seed (node IDs projects/<any>/zones/<any>/instances/<name>)")
	disks         = flag.String("disks", "", "comma-separated zonal disks to seed: <name> (in --zone) or <zone>/<name>")
	lateInstances = flag.String("instances-on-sigusr1", "", "comma-separated instance names inserted when the process gets SIGUSR1 (an instance that appears while the driver is backing off)")

	// The driver's flags, with its defaults.
	errorBackoffInitialDurationMs = flag.Int("backoff-initial-duration-ms", 200, "The amount of ms for the initial duration of the backoff condition for controller publish/unpublish CSI operations. Default is 200.")
	errorBackoffMaxDurationMs     = flag.Int("backoff-max-duration-ms", 300000, "The amount of ms for the max duration of the backoff condition for controller publish/unpublish CSI operations. Default is 300000 (5m).")
)

// computeURL is the API prefix of Compute Engine resource links (disk
// self-links and users), which the driver's ListVolumes parses.
const computeURL = "https://www.googleapis.com/compute/v1/"

// lockedProvider serializes the fake provider's state and keeps disk users.
type lockedProvider struct {
	*gce.FakeCloudProvider
	mu sync.Mutex
	// disks are the seeded disks by key (meta.Key.String()), as the fake holds them.
	disks map[string]*computev1.Disk
}

func (p *lockedProvider) ListDisks(ctx context.Context, fields []googleapi.Field) ([]*computev1.Disk, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list, token, err := p.FakeCloudProvider.ListDisks(ctx, fields)
	copies := make([]*computev1.Disk, 0, len(list))
	for _, disk := range list {
		c := *disk
		c.Users = append([]string(nil), disk.Users...)
		copies = append(copies, &c)
	}
	return copies, token, err
}

func (p *lockedProvider) ListDisksWithFilter(ctx context.Context, fields []googleapi.Field, filter string) ([]*computev1.Disk, string, error) {
	return p.ListDisks(ctx, fields)
}

func (p *lockedProvider) GetInstanceOrError(ctx context.Context, project, instanceZone, instanceName string) (*computev1.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	instance, err := p.FakeCloudProvider.GetInstanceOrError(ctx, project, instanceZone, instanceName)
	if err != nil {
		return nil, err
	}
	return snapshot(instance), nil
}

func (p *lockedProvider) ListInstances(ctx context.Context, fields []googleapi.Field) ([]*computev1.Instance, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list, token, err := p.FakeCloudProvider.ListInstances(ctx, fields)
	copies := make([]*computev1.Instance, 0, len(list))
	for _, instance := range list {
		copies = append(copies, snapshot(instance))
	}
	return copies, token, err
}

func (p *lockedProvider) AttachDisk(ctx context.Context, project string, volKey *meta.Key, readWrite, diskType, instanceZone, instanceName string, forceAttach bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.FakeCloudProvider.AttachDisk(ctx, project, volKey, readWrite, diskType, instanceZone, instanceName, forceAttach); err != nil {
		return err
	}
	if disk, ok := p.disks[volKey.String()]; ok {
		disk.Users = append(disk.Users, instanceURL(project, instanceZone, instanceName))
	}
	return nil
}

func (p *lockedProvider) DetachDisk(ctx context.Context, project, deviceName, instanceZone, instanceName string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.FakeCloudProvider.DetachDisk(ctx, project, deviceName, instanceZone, instanceName); err != nil {
		return err
	}
	// A zonal disk's device name is its name.
	user := instanceURL(project, instanceZone, instanceName)
	for _, disk := range p.disks {
		if disk.Name != deviceName {
			continue
		}
		kept := disk.Users[:0]
		for _, u := range disk.Users {
			if u != user {
				kept = append(kept, u)
			}
		}
		disk.Users = kept
	}
	return nil
}

func instanceURL(project, zone, name string) string {
	return fmt.Sprintf("%sprojects/%s/zones/%s/instances/%s", computeURL, project, zone, name)
}

// snapshot copies an instance and its disk list, so a caller reads it without the lock.
func snapshot(instance *computev1.Instance) *computev1.Instance {
	c := *instance
	c.Disks = append([]*computev1.AttachedDisk(nil), instance.Disks...)
	return &c
}

func newInstance(name string) *computev1.Instance {
	return &computev1.Instance{
		Name:     name,
		SelfLink: instanceURL(*project, *zone, name),
		Disks:    []*computev1.AttachedDisk{},
	}
}

func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func main() {
	klog.InitFlags(flag.CommandLine)
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "gce-pd-driver: --endpoint is required")
		os.Exit(2)
	}

	var seeded []*gce.CloudDisk
	byKey := map[string]*computev1.Disk{}
	for _, d := range splitList(*disks) {
		diskZone, name := *zone, d
		if z, n, ok := strings.Cut(d, "/"); ok {
			diskZone, name = z, n
		}
		// The fake keys a disk by its zone field, so that is the bare zone name.
		disk := &computev1.Disk{
			Name:     name,
			Zone:     diskZone,
			Type:     "pd-balanced",
			SizeGb:   10,
			Status:   "READY",
			SelfLink: fmt.Sprintf("%sprojects/%s/zones/%s/disks/%s", computeURL, *project, diskZone, name),
		}
		byKey[meta.ZonalKey(name, diskZone).String()] = disk
		seeded = append(seeded, gce.CloudDiskFromV1(disk))
	}
	fake, err := gce.CreateFakeCloudProvider(*project, *zone, seeded)
	if err != nil {
		klog.Fatalf("creating the fake cloud provider: %v", err)
	}
	for _, name := range splitList(*instances) {
		fake.InsertInstance(newInstance(name), *zone, name)
	}
	cloud := &lockedProvider{FakeCloudProvider: fake, disks: byKey}
	if late := splitList(*lateInstances); len(late) > 0 {
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, syscall.SIGUSR1)
		go func() {
			<-signals
			cloud.mu.Lock()
			defer cloud.mu.Unlock()
			for _, name := range late {
				fake.InsertInstance(newInstance(name), *zone, name)
			}
			klog.Infof("SIGUSR1: inserted instances %v", late)
		}()
	}

	gceDriver := driver.GetGCEDriver()
	identityServer := driver.NewIdentityServer(gceDriver)
	controllerServer := driver.NewControllerServer(
		gceDriver, cloud,
		time.Duration(*errorBackoffInitialDurationMs)*time.Millisecond,
		time.Duration(*errorBackoffMaxDurationMs)*time.Millisecond,
		[]string{},                           // fallbackRequisiteZones
		false,                                // enableStoragePools
		false,                                // enableDataCache
		driver.MultiZoneVolumeHandleConfig{}, // multi-zone handles off (the driver's default)
		driver.ListVolumesConfig{},
		driver.ProvisionableDisksConfig{},
		false, // enableHdHA
		&driver.GCEControllerServerArgs{},
	)
	if err := gceDriver.SetupGCEDriver(*driverName, "fake", nil, nil, identityServer, controllerServer, nil); err != nil {
		klog.Fatalf("initializing the GCE PD CSI driver: %v", err)
	}
	klog.Infof("serving %s on %s: project %s, zone %s, instances %v, disks %v",
		*driverName, *endpoint, *project, *zone, splitList(*instances), splitList(*disks))
	gceDriver.Run(*endpoint, 10000, false /* enableOtelTracing */, nil /* metricsManager */)
}

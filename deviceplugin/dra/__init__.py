"""The DRA kubelet plugin (driver `sriov.plexus.io`) on the device plugin's discovery:
ResourceSlices (slices.py, publish.py), Prepare/Unprepare with CDI (prepare.py, cdi.py,
params.py, bind.py, state.py) and the kubelet's gRPC server (server.py); plugin.py joins
them."""

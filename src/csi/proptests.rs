//! Hostile CSI responses: prost decodes any bytes into the response types the
//! client reads, or fails, without a panic; a string that is not UTF-8 fails
//! the decode with the field named, and that is what the VA's error says.
//! 256 cases each (`PROPTEST_CASES` for more).

use proptest::prelude::*;
use prost::Message;

use super::proto::*;
use super::RpcStatus;

/// A protobuf field key (tag and wire type) followed by a plausible payload,
/// so that the decoders get past the first byte often.
fn field() -> impl Strategy<Value = Vec<u8>> {
    (
        1u32..6,
        prop::sample::select(vec![0u8, 1, 2, 5, 3, 4, 6, 7]),
        prop::collection::vec(any::<u8>(), 0..24),
    )
        .prop_map(|(tag, wire, payload)| {
            let mut out = Vec::new();
            prost::encoding::encode_varint(u64::from(tag << 3 | u32::from(wire)), &mut out);
            if wire == 2 {
                // A length that may lie about the payload.
                let len = payload.first().map_or(0, |b| usize::from(*b % 32));
                prost::encoding::encode_varint(len as u64, &mut out);
            }
            out.extend(payload);
            out
        })
}

fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..128),
        prop::collection::vec(field(), 0..8).prop_map(|f| f.concat()),
        // A valid message with bytes flipped.
        (
            prop::collection::hash_map(".{0,6}", ".{0,6}", 0..4),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        )
            .prop_map(|(context, flips)| {
                let mut b = ControllerPublishVolumeResponse {
                    publish_context: context,
                }
                .encode_to_vec();
                for (at, byte) in flips {
                    if !b.is_empty() {
                        let i = at.index(b.len());
                        b[i] = byte;
                    }
                }
                b
            }),
    ]
}

fn decode_all(bytes: &[u8]) {
    let _ = ControllerPublishVolumeResponse::decode(bytes);
    let _ = ControllerUnpublishVolumeResponse::decode(bytes);
    let _ = ListVolumesResponse::decode(bytes);
    let _ = ControllerGetCapabilitiesResponse::decode(bytes);
    let _ = GetPluginInfoResponse::decode(bytes);
    let _ = GetPluginCapabilitiesResponse::decode(bytes);
    let _ = ProbeResponse::decode(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_bytes_decode_or_fail_without_panic(bytes in hostile_bytes()) {
        decode_all(&bytes);
    }

    #[test]
    fn a_publish_context_round_trips_whatever_its_size(
        context in prop::collection::hash_map(".{0,40}", ".{0,200}", 0..64)
    ) {
        let bytes = ControllerPublishVolumeResponse { publish_context: context.clone() }.encode_to_vec();
        let back = ControllerPublishVolumeResponse::decode(bytes.as_slice());
        prop_assert_eq!(back.map(|r| r.publish_context).ok(), Some(context));
    }
}

/// A map entry of `publish_context` whose value is not UTF-8.
fn publish_context_with_invalid_utf8() -> Vec<u8> {
    // entry: key (field 1) "k", value (field 2) 0xff 0xfe
    let entry = [0x0a, 0x01, b'k', 0x12, 0x02, 0xff, 0xfe];
    let mut bytes = vec![0x0a, entry.len() as u8];
    bytes.extend(entry);
    bytes
}

#[test]
fn invalid_utf8_in_the_publish_context_is_a_decode_error_naming_the_field() {
    let err =
        ControllerPublishVolumeResponse::decode(publish_context_with_invalid_utf8().as_slice())
            .expect_err("not UTF-8");
    let text = err.to_string();
    assert!(
        text.contains("ControllerPublishVolumeResponse.publish_context") && text.contains("UTF-8"),
        "{text}"
    );
    // tonic's prost codec turns a decode error into INTERNAL with that text;
    // RpcStatus renders it in Go's form, which is what `attachError` carries.
    let status = RpcStatus::from(tonic::Status::internal(text.clone()));
    assert_eq!(
        status.to_string(),
        format!("rpc error: code = Internal desc = {text}")
    );
}

#[test]
fn invalid_utf8_in_a_listed_volume_id_is_a_decode_error() {
    // entries (1) { volume (1) { volume_id (2) = 0xff } }
    let volume = [0x12, 0x01, 0xff];
    let entry = [&[0x0a, volume.len() as u8][..], &volume].concat();
    let bytes = [&[0x0a, entry.len() as u8][..], &entry].concat();
    let err = ListVolumesResponse::decode(bytes.as_slice()).expect_err("not UTF-8");
    assert!(err.to_string().contains("UTF-8"), "{err}");
}

package posenc;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Reader of the safetensors format: u64 little-endian header length, JSON header, tensor bytes. */
public final class Safetensors {
    /** The tensors of a file by name, and its {@code __metadata__} strings. */
    public record File(Map<String, Tensor> tensors, Map<String, String> metadata) {
    }

    private Safetensors() {
    }

    @SuppressWarnings("unchecked")
    public static File parse(byte[] bytes) {
        if (bytes.length < 8) {
            throw new IllegalArgumentException("safetensors: " + bytes.length + " bytes");
        }
        long n = PosencClient.little(bytes).getLong(0);
        if (n < 0 || n > bytes.length - 8) {
            throw new IllegalArgumentException("safetensors: header runs past the end");
        }
        int base = 8 + (int) n;
        Map<String, Object> header = (Map<String, Object>) Json.parse(
                new String(bytes, 8, (int) n, StandardCharsets.UTF_8));
        Map<String, Tensor> tensors = new LinkedHashMap<>();
        Map<String, String> metadata = new LinkedHashMap<>();
        for (Map.Entry<String, Object> e : header.entrySet()) {
            Map<String, Object> info = (Map<String, Object>) e.getValue();
            if (e.getKey().equals("__metadata__")) {
                info.forEach((k, v) -> metadata.put(k, String.valueOf(v)));
                continue;
            }
            long[] offsets = longs(info.get("data_offsets"));
            if (offsets.length != 2 || offsets[0] < 0 || offsets[0] > offsets[1] || offsets[1] > bytes.length - base) {
                throw new IllegalArgumentException("safetensors: bad data_offsets of " + e.getKey());
            }
            byte[] data = Arrays.copyOfRange(bytes, base + (int) offsets[0], base + (int) offsets[1]);
            tensors.put(e.getKey(), new Tensor(DType.of((String) info.get("dtype")), longs(info.get("shape")), data));
        }
        return new File(tensors, metadata);
    }

    /** A JSON list of numbers as long[]. */
    static long[] longs(Object list) {
        return ((List<?>) list).stream().mapToLong(x -> ((Number) x).longValue()).toArray();
    }
}

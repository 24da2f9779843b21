package posenc;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;

/** Reader of the safetensors format: u64 little-endian header length, JSON header, tensor bytes. */
public final class Safetensors {
    /** The tensors of a file by name, and its {@code __metadata__} strings. */
    public record File(Map<String, Tensor> tensors, Map<String, String> metadata) {
    }

    private Safetensors() {
    }

    public static File parse(byte[] bytes) {
        if (bytes.length < 8) {
            throw new IllegalArgumentException("safetensors: " + bytes.length + " bytes");
        }
        long n = PosencClient.little(bytes).getLong(0);
        if (n < 0 || n > bytes.length - 8) {
            throw new IllegalArgumentException("safetensors: header runs past the end");
        }
        int base = 8 + (int) n;
        JsonObject header = PosencClient.parseObject(new String(bytes, 8, (int) n, StandardCharsets.UTF_8));
        Map<String, Tensor> tensors = new LinkedHashMap<>();
        Map<String, String> metadata = new LinkedHashMap<>();
        for (Map.Entry<String, JsonElement> e : header.entrySet()) {
            JsonObject info = e.getValue().getAsJsonObject();
            if (e.getKey().equals("__metadata__")) {
                info.entrySet().forEach(m -> metadata.put(m.getKey(), m.getValue().getAsString()));
                continue;
            }
            long[] offsets = longs(info.getAsJsonArray("data_offsets"));
            if (offsets.length != 2 || offsets[0] < 0 || offsets[0] > offsets[1] || offsets[1] > bytes.length - base) {
                throw new IllegalArgumentException("safetensors: bad data_offsets of " + e.getKey());
            }
            byte[] data = Arrays.copyOfRange(bytes, base + (int) offsets[0], base + (int) offsets[1]);
            tensors.put(e.getKey(), new Tensor(DType.of(info.get("dtype").getAsString()), longs(info.getAsJsonArray("shape")),
                    data));
        }
        return new File(tensors, metadata);
    }

    /** A JSON array of numbers as long[]. */
    static long[] longs(JsonArray list) {
        long[] out = new long[list.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = list.get(i).getAsLong();
        }
        return out;
    }
}

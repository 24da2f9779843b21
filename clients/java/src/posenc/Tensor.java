package posenc;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * One array: dtype, shape and its little-endian, row-major bytes. float16/bfloat16 stay raw bits in
 * {@link #data} and are widened by {@link #toDoubles()}.
 */
public record Tensor(DType dtype, long[] shape, byte[] data) {
    public Tensor {
        long bytes = dtype.size;
        for (long d : shape) { // the fields are not assigned yet: size() would read null
            bytes *= d;
        }
        if (bytes != data.length) {
            throw new IllegalArgumentException(data.length + " bytes for shape " + Arrays.toString(shape)
                    + " of " + dtype.serviceName);
        }
    }

    /** Number of elements the shape holds. */
    public long size() {
        long n = 1;
        for (long d : shape) {
            n *= d;
        }
        return n;
    }

    private ByteBuffer buffer() {
        return ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN);
    }

    /** Every element as double: float16/bfloat16 bits decoded, integers converted. */
    public double[] toDoubles() {
        ByteBuffer b = buffer();
        double[] out = new double[(int) size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = switch (dtype) {
                case FLOAT64 -> b.getDouble();
                case FLOAT32 -> b.getFloat();
                case FLOAT16 -> float16ToDouble(b.getShort());
                case BFLOAT16 -> Float.intBitsToFloat((b.getShort() & 0xffff) << 16);
                case INT64 -> b.getLong();
                case INT32 -> b.getInt();
                case INT16 -> b.getShort();
                case INT8 -> b.get();
                case UINT64 -> unsigned(b.getLong());
                case UINT32 -> b.getInt() & 0xffffffffL;
                case UINT16 -> b.getShort() & 0xffff;
                case UINT8, BOOL -> b.get() & 0xff;
            };
        }
        return out;
    }

    private static double unsigned(long v) {
        return v >= 0 ? v : (double) (v >>> 1) * 2.0 + (v & 1);
    }

    /** The elements of an int64 tensor. */
    public long[] toLongs() {
        if (dtype != DType.INT64) {
            throw new IllegalStateException("toLongs of a " + dtype.serviceName + " tensor");
        }
        long[] out = new long[(int) size()];
        buffer().asLongBuffer().get(out);
        return out;
    }

    /** IEEE 754 half-precision bits to double (subnormals, infinities and NaN included). */
    public static double float16ToDouble(short bits) {
        int h = bits & 0xffff;
        double sign = (h & 0x8000) != 0 ? -1 : 1;
        int exp = (h >> 10) & 0x1f;
        int frac = h & 0x3ff;
        if (exp == 0) {
            return sign * Math.scalb((double) frac, -24);
        }
        if (exp == 31) {
            return frac != 0 ? Double.NaN : sign * Double.POSITIVE_INFINITY;
        }
        return sign * Math.scalb(1 + frac / 1024.0, exp - 15);
    }

    @Override
    public String toString() {
        return "Tensor[" + dtype.serviceName + " " + Arrays.toString(shape) + "]";
    }
}

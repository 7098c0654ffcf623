/**
 * Jest: ts-jest compiles src to CommonJS. The data layer runs in node (no JupyterLab, no
 * DOM); a test file that renders the panel asks for jsdom in its docblock
 * (`@jest-environment jsdom`, from jest-environment-jsdom).
 */
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/src'],
  testMatch: ['**/__tests__/**/*.test.ts'],
  transform: {
    '^.+\\.ts$': [
      'ts-jest',
      {
        tsconfig: {
          module: 'commonjs',
          target: 'ES2020',
          lib: ['DOM', 'ES2020'],
          strict: true,
          esModuleInterop: true,
          types: ['jest', 'node'],
          isolatedModules: true
        }
      }
    ]
  }
};
